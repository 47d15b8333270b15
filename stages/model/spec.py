"""One description of a decoder-only model: its sizes, its optional parts, and what follows
from them (parameters, weight and KV bytes, the arithmetic of a step).

Every model source describes itself with a `ModelSpec`: the built-in models
(`stages.model.transformer`), Hugging Face checkpoints
(`stages.loading.checkpoint.read_spec`), and the weightless
`model=spec` option (stages.model.spec_option: config.json, or a preset's fields). The memory
check, `pipeline.inspect` and the simulated device's cost model read it; nothing here needs
Paddle. Every count is per device under tensor parallelism `tp`: attention heads, KV heads,
MLP and expert widths, and the vocabulary are split; norms, the output-projection and
down-projection biases and the MoE router are replicated; KV heads are replicated when
there are fewer of them than devices.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from stages.arithmetic import ceil_div


class ComputeDtype(enum.StrEnum):
    """The compute dtypes the models run in (`model.dtype`), by Paddle's names; members are
    named by their values: OmegaConf matches a config value by name."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class WeightStorage(enum.StrEnum):
    """How a loaded model keeps its projection weights (`model.weights`): in its compute
    dtype, or int8 with a scale per output (stages/model/int8_weight.py)."""

    float32 = "float32"
    int8 = "int8"


# Bytes of one value in each compute dtype the models run in.
DTYPE_BYTES: dict[str, int] = {
    ComputeDtype.float32: 4,
    ComputeDtype.float16: 2,
    ComputeDtype.bfloat16: 2,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes of one value of a compute dtype (an unknown one counts as float32's)."""
    return DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True)
class MoeLayout:
    """Routed experts of the MoE layers (ERNIE-4.5 style: shared experts always run)."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int
    layers: frozenset[int]
    norm_min: float = 1e-12  # the chosen experts' weights sum to at least this

    def __post_init__(self) -> None:
        if self.expert_intermediate_size < 1 or self.num_shared_experts < 0:
            raise ValueError(
                f"model.expert_intermediate_size={self.expert_intermediate_size} must be >= 1 "
                f"and model.num_shared_experts={self.num_shared_experts} >= 0"
            )
        if not self.layers:
            raise ValueError("model: no layer routes to experts: check model.moe_layer_*")

    def experts_touched(self, tokens: float) -> float:
        """Distinct experts a step's tokens route to, expected under uniform routing: each
        expert is missed by a token with probability 1 - k/E."""
        if tokens <= 0:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** tokens)


@dataclass(frozen=True)
class Checkpoint:
    """What the published checkpoint holds beyond the shapes the cost model reads: which
    engines serve it (their architecture lists), whether it speculates with its own head,
    and where its FP8 form is published."""

    architecture: str = ""  # config.json's architectures[0]; "" = not stated
    mtp_layers: int = -1  # num_nextn_predict_layers; -1 = not stated
    fp8_checkpoint: str = ""  # the published FP8 checkpoint's id; "" = none published


@dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP's (dense layers of a MoE model too)
    name: str = "model"
    tied_embeddings: bool = False  # the lm head is the embedding table
    qkv_bias: bool = False
    out_bias: bool = False  # the attention's output projection
    mlp_bias: bool = False  # gate, up and down projections (experts' too)
    lm_head_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each query and key head (Qwen3)
    dtype_bytes: int = 2  # bytes of one weight and one KV value: bf16 by default
    moe: MoeLayout | None = None
    # The context the model was trained for, as config.json names it (0: not stated).
    max_position_embeddings: int = 0
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    # _linear_params by (tp, experts): not a field of the model, only what it computed
    _linear_memo: dict[tuple[int, float], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key}={getattr(self, key)} must be >= 1")
        for key in ("head_dim", "intermediate_size", "dtype_bytes"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key}={getattr(self, key)} must be >= 1")
        if self.max_position_embeddings < 0:
            raise ValueError(
                f"model.max_position_embeddings={self.max_position_embeddings} must be >= 0 "
                "(0: not stated)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} is not a multiple of "
                f"model.num_kv_heads={self.num_kv_heads}"
            )
        moe = self.moe
        if moe is not None and not 1 <= moe.experts_per_token <= moe.num_experts:
            raise ValueError(
                f"model.experts_per_token={moe.experts_per_token} must be between 1 and "
                f"model.num_experts={moe.num_experts}"
            )

    # -- tensor parallelism -------------------------------------------------------------

    def check_tp(self, tp: int) -> None:
        kv = self.num_kv_heads
        if tp < 1 or self.num_heads % tp or (kv % tp and tp % kv):
            raise ValueError(
                f"tp={tp} does not split {self.name}'s {self.num_heads} heads and {kv} KV "
                "heads evenly: choose a tp dividing num_heads, with KV heads divisible by "
                "it or it by them"
            )

    def heads_per_device(self, tp: int = 1) -> int:
        self.check_tp(tp)
        return self.num_heads // tp

    def kv_heads_per_device(self, tp: int = 1) -> int:
        self.check_tp(tp)
        return max(1, self.num_kv_heads // tp)

    # -- parameters ---------------------------------------------------------------------

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else len(self.moe.layers)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers

    def attention_params(self, tp: int = 1) -> int:
        """One layer's q, k, v and o projections (and their biases), per device."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.heads_per_device(tp), self.kv_heads_per_device(tp)
        bias = d * (q + 2 * kv) if self.qkv_bias else 0
        return h * d * (2 * q + 2 * kv) + bias + (h if self.out_bias else 0)

    def norm_params(self) -> int:
        """One layer's norms: before attention, before the MLP, and q/k norms."""
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    def mlp_params(self, width: int, tp: int = 1) -> int:
        """A SwiGLU MLP of `width` (gate, up, down and their biases), per device."""
        split = ceil_div(width, tp)
        bias = 2 * split + self.hidden_size if self.mlp_bias else 0
        return 3 * self.hidden_size * split + bias

    def dense_mlp_params(self, tp: int = 1) -> int:
        return self.mlp_params(self.intermediate_size, tp)

    def expert_params(self, tp: int = 1) -> int:
        """One routed expert's gate, up and down projections, per device."""
        if self.moe is None:
            return 0
        return self.mlp_params(self.moe.expert_intermediate_size, tp)

    def shared_expert_params(self, tp: int = 1) -> int:
        """The shared experts, one MLP as wide as all of them together, per device."""
        if self.moe is None or not self.moe.num_shared_experts:
            return 0
        moe = self.moe
        return self.mlp_params(moe.expert_intermediate_size * moe.num_shared_experts, tp)

    def router_params(self) -> int:
        """The router's weight and correction bias, replicated on every device."""
        return 0 if self.moe is None else (self.hidden_size + 1) * self.moe.num_experts

    def lm_head_params(self, tp: int = 1) -> int:
        return ceil_div(self.vocab_size, tp) * self.hidden_size

    def _moe_layer_params(self, tp: int, experts: float) -> float:
        routed = experts * self.expert_params(tp)
        return self.router_params() + self.shared_expert_params(tp) + routed

    def _params(self, tp: int, experts: float, embeddings: bool) -> float:
        layers: float = self.num_layers * (self.attention_params(tp) + self.norm_params())
        layers += self.num_dense_layers * self.dense_mlp_params(tp)
        layers += self.num_moe_layers * self._moe_layer_params(tp, experts)
        if not embeddings:
            return layers + self.hidden_size
        tables = 1 if self.tied_embeddings else 2
        head_bias = ceil_div(self.vocab_size, tp) if self.lm_head_bias else 0
        return layers + self.hidden_size + tables * self.lm_head_params(tp) + head_bias

    def num_parameters(self, tp: int = 1) -> int:
        """Every weight (per device at `tp`): embeddings, layers, final norm, untied lm head."""
        experts = self.moe.num_experts if self.moe else 0
        return int(self._params(tp, experts, embeddings=True))

    def active_parameters(self, embeddings: bool = True) -> int:
        """The weights one token runs through: the routed experts it picks, not all."""
        experts = self.moe.experts_per_token if self.moe else 0
        return int(self._params(1, experts, embeddings))

    def weight_bytes(self, tp: int = 1) -> int:
        return self.num_parameters(tp) * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Keys and values of one token in every layer, per device."""
        per_layer = 2 * self.kv_heads_per_device(tp) * self.head_dim * self.dtype_bytes
        return self.num_layers * per_layer

    # -- the terms of a step ------------------------------------------------------------

    def linear_flops(self, tokens: float, tp: int = 1) -> float:
        """Projections, MLPs and experts over `tokens` rows: 2 FLOPs a multiply-add, each
        token through its top-k routed experts, the shared experts and the router."""
        k = self.moe.experts_per_token if self.moe else 0
        return 2.0 * tokens * self._linear_params(tp, k)

    def linear_bytes(self, tokens: float, tp: int = 1) -> float:
        """Weights the GEMMs read once: every dense matrix, and of the routed experts only
        those the step's tokens touch. Activations and norm vectors are left out: small
        beside the weights wherever the weights' read is what bounds the step."""
        if tokens <= 0:
            return 0.0
        touched = self.moe.experts_touched(tokens) if self.moe else 0.0
        return self._linear_params(tp, touched) * self.dtype_bytes

    def non_routed_params(self, tp: int = 1) -> float:
        """The weights per device a token's GEMMs run through outside the routed experts:
        attention, dense MLPs, routers and shared experts."""
        return self._linear_params(tp, 0.0)

    def _linear_params(self, tp: int, experts: float) -> float:
        """The weights per device a token's GEMMs run through: every layer's attention, the
        dense MLPs, and in MoE layers the router, the shared experts and `experts` routed
        ones. Kept per (tp, experts): a cost model asks at every step size it meets."""
        key = (tp, float(experts))  # (as a float: 0 and 0.0 are one key)
        params = self._linear_memo.get(key)
        if params is None:
            params = self.num_layers * self.attention_params(tp)
            params += self.num_dense_layers * self.dense_mlp_params(tp)
            params += self.num_moe_layers * self._moe_layer_params(tp, key[1])
            self._linear_memo[key] = params
        return params

    def attention_flops(self, query_key_pairs: float, tp: int = 1) -> float:
        """QK and PV: 2 x head_dim FLOPs each, per query-key pair, head and layer."""
        heads = self.heads_per_device(tp)
        return 4.0 * query_key_pairs * heads * self.head_dim * self.num_layers

    def kv_bytes(self, tokens: float, tp: int = 1) -> float:
        """KV cache traffic of `tokens` slots (read or written) in every layer."""
        return tokens * self.kv_bytes_per_token(tp)

    def lm_head_flops(self, rows: float, tp: int = 1) -> float:
        return 2.0 * rows * self.lm_head_params(tp)

    def lm_head_bytes(self, rows: float, tp: int = 1) -> float:
        return self.lm_head_params(tp) * self.dtype_bytes if rows > 0 else 0.0

    def allreduce_bytes(self, tokens: float, tp: int = 1) -> float:
        """What each device sends in the ring all-reduces of a step: two per layer (after
        attention and after the MLP), each of tokens x hidden activations."""
        if tp == 1 or tokens <= 0:
            return 0.0
        message = tokens * self.hidden_size * self.dtype_bytes
        return 2 * self.num_layers * message * 2.0 * (tp - 1) / tp


def moe_layers(num_layers: int, start: int, end: int, interval: int) -> frozenset[int]:
    """ERNIE-4.5's rule: every `interval`-th layer from start to end (inclusive, -1 = last)."""
    end = num_layers - 1 if end < 0 else end
    return frozenset(i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end)


def even_head_dim(hidden_size: int, num_heads: int) -> int:
    """A head's width where the config gives none: the hidden size split evenly."""
    return hidden_size // num_heads if num_heads else 0


def built_in_spec(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    head_dim: int,
    dtype: str,
) -> ModelSpec:
    """The built-in model of these sizes (`model=tiny`, `small`): a dense Llama-style
    decoder with an untied lm head, holding its weights in `dtype`."""
    return ModelSpec(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim or even_head_dim(hidden_size, num_heads),
        intermediate_size=intermediate_size,
        name="built-in",
        dtype_bytes=dtype_bytes(dtype),
    )
