"""The weight plan: every tensor an architecture needs, by its Hugging Face name, and where
each (part) goes in the model's layout."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from stages.loading.checkpoint.config import CheckpointSpec


@dataclass(frozen=True)
class Placement:
    """Where (part of) one stored tensor goes: rows `rows` of it, seen as [-1, last axis]
    (all of it when None), into buffer `dest` at `cols` of its last axis (all of it when
    None), transposed first when stored as an HF Linear weight [out, in]. A fused tensor
    (all experts' gate_up_proj) has one placement per part."""

    dest: str
    rows: slice | None = None
    cols: slice | None = None
    transpose: bool = False


@dataclass
class WeightPlan:
    buffers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # stored, by HF name
    placements: dict[str, list[Placement]] = field(default_factory=dict)
    float32_buffers: set[str] = field(default_factory=set)  # kept float32 whatever the dtype

    def place(self, key: str, shape: tuple[int, ...], placement: Placement) -> None:
        self.shapes[key] = shape
        self.placements.setdefault(key, []).append(placement)

    def parts_per_buffer(self) -> dict[str, int]:
        """How many stored tensors fill each model tensor: a loader hands a buffer to the
        model once that many have been placed."""
        pending: dict[str, int] = defaultdict(int)
        for placements in self.placements.values():
            for placement in placements:
                pending[placement.dest] += 1
        return pending

    def vector(self, key: str, dest: str, size: int, stored: tuple[int, ...] = ()) -> None:
        self.buffers[dest] = (size,)
        self.place(key, stored or (size,), Placement(dest))

    def linears(
        self, dest: str, prefix: str, in_features: int, parts: Iterable[tuple[str, int]], bias: bool
    ) -> None:
        """HF Linear layers [out, in] side by side as one [in, sum(out)] matmul weight."""
        parts = list(parts)
        width = sum(out for _, out in parts)
        self.buffers[dest] = (in_features, width)
        if bias:
            self.buffers[dest + ".bias"] = (width,)
        offset = 0
        for name, out in parts:
            cols = slice(offset, offset + out)
            key = f"{prefix}{name}.weight"
            self.place(key, (out, in_features), Placement(dest, cols=cols, transpose=True))
            if bias:
                self.place(f"{prefix}{name}.bias", (out,), Placement(dest + ".bias", cols=cols))
            offset += out

    def mlp(self, dest: str, prefix: str, hidden: int, inter: int, bias: bool) -> None:
        """Gate and up side by side as one weight (the model's DenseMLP.gate_up), then down."""
        gate_up = [("gate_proj", inter), ("up_proj", inter)]
        self.linears(dest + ".gate_up", prefix, hidden, gate_up, bias)
        self.linears(dest + ".down", prefix, inter, [("down_proj", hidden)], bias)

    def fused_experts(self, dest: str, prefix: str, experts: int, hidden: int, inter: int) -> None:
        """transformers 5's fused experts (its Experts modules and conversion mapping):
        gate_up_proj [experts, 2 * inter, hidden], each expert's gate rows then its up rows,
        and down_proj [experts, hidden, inter]; every expert's slice is an HF Linear
        [out, in], unbiased."""
        gate_up, down = prefix + "gate_up_proj", prefix + "down_proj"
        for e in range(experts):
            to = f"{dest}.{e}"
            self.buffers[to + ".gate_up"] = (hidden, 2 * inter)
            self.buffers[to + ".down"] = (inter, hidden)
            # The expert's gate rows then its up rows: its gate_up columns, in that order.
            rows = slice(2 * e * inter, 2 * (e + 1) * inter)
            placement = Placement(to + ".gate_up", rows=rows, transpose=True)
            self.place(gate_up, (experts, 2 * inter, hidden), placement)
            rows = slice(e * hidden, (e + 1) * hidden)
            placement = Placement(to + ".down", rows=rows, transpose=True)
            self.place(down, (experts, hidden, inter), placement)


# Where transformers 5 and the remote code keep the MoE router's correction bias.
CORRECTION_BIAS_KEYS = (
    "mlp.moe_statics.e_score_correction_bias",
    "mlp.gate.moe_statics.e_score_correction_bias",
)


def _moe_plan(
    plan: WeightPlan, spec: CheckpointSpec, src: str, dest: str, stored: Collection[str]
) -> None:
    """One MoE layer's router, experts (per expert or fused, as stored) and shared experts."""
    model = spec.model
    moe, h = model.moe, model.hidden_size
    assert moe is not None
    plan.buffers[dest + "router"] = (h, moe.num_experts)
    plan.place(
        src + "mlp.gate.weight", (moe.num_experts, h), Placement(dest + "router", transpose=True)
    )
    bias_key = next((k for k in CORRECTION_BIAS_KEYS if src + k in stored), CORRECTION_BIAS_KEYS[0])
    plan.vector(src + bias_key, dest + "correction", moe.num_experts, (1, moe.num_experts))
    plan.float32_buffers |= {dest + "router", dest + "correction"}
    experts, inter = src + "mlp.experts.", moe.expert_intermediate_size
    if experts + "gate_up_proj" in stored:
        plan.fused_experts(dest + "experts", experts, moe.num_experts, h, inter)
    else:
        for e in range(moe.num_experts):
            plan.mlp(f"{dest}experts.{e}", f"{experts}{e}.", h, inter, model.mlp_bias)
    if moe.num_shared_experts:
        shared = inter * moe.num_shared_experts
        plan.mlp(dest + "shared", src + "mlp.shared_experts.", h, shared, model.mlp_bias)


def weight_plan(spec: CheckpointSpec, stored: Collection[str] = ()) -> WeightPlan:
    """Every tensor the architecture needs, by its HF name, and where it goes. `stored`, the
    folder's tensor names, picks between namings (fused or per-expert MoE experts); without
    it, the per-expert naming of Baidu's folders."""
    plan = WeightPlan()
    dims = spec.model
    h, d, vocab = dims.hidden_size, dims.head_dim, dims.vocab_size
    q_width, kv_width = dims.num_heads * d, dims.num_kv_heads * d
    plan.buffers["embed"] = (vocab, h)
    plan.place("model.embed_tokens.weight", (vocab, h), Placement("embed"))
    for i in range(dims.num_layers):
        src, dest = f"model.layers.{i}.", f"layers.{i}."
        plan.vector(src + "input_layernorm.weight", dest + "attn_norm", h)
        plan.vector(src + "post_attention_layernorm.weight", dest + "mlp_norm", h)
        attn = [("q_proj", q_width), ("k_proj", kv_width), ("v_proj", kv_width)]
        plan.linears(dest + "qkv", src + "self_attn.", h, attn, dims.qkv_bias)
        plan.linears(dest + "out", src + "self_attn.", q_width, [("o_proj", h)], dims.out_bias)
        if dims.qk_norm:
            plan.vector(src + "self_attn.q_norm.weight", dest + "q_norm", d)
            plan.vector(src + "self_attn.k_norm.weight", dest + "k_norm", d)
        if dims.is_moe_layer(i):
            _moe_plan(plan, spec, src, dest, stored)
        else:
            plan.mlp(dest + "mlp", src + "mlp.", h, dims.intermediate_size, dims.mlp_bias)
    plan.vector("model.norm.weight", "final_norm", h)
    if not dims.tied_embeddings:
        plan.linears("lm_head", "", h, [("lm_head", vocab)], dims.lm_head_bias)
    elif dims.lm_head_bias:
        plan.vector("lm_head.bias", "lm_head.bias", vocab)
    return plan
