"""A decoder-only transformer of the Llama / Qwen / ERNIE-4.5 family, written with Paddle ops.

RMSNorm, rotary positions (rotate-half, or interleaved pairs as in ERNIE-4.5), grouped-query
attention with optional q/k/v biases and per-head q/k RMSNorm (Qwen3), and a SwiGLU MLP or
a mixture of experts. The model computes projections and the MLP on a step's rows;
attention goes to the attention stage, which owns the KV cache and may have the model
run on a step's real tokens only (its packs_rows: the metadata builder then lays out
those alone). Built-in weights are drawn
from a seed, so no download; stages/loading/checkpoint/ builds the same model from a Hugging Face
folder.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle
import paddle.nn.functional as F

from stages.forward.forward_meta import ForwardMeta
from stages.model.compiled_layers import compiled_layers
from stages.model.int8_weight import Int8Weight, Weight, dense, kernel, project
from stages.model.rope import rope_inv_freq
from stages.model.spec import DTYPE_BYTES, ModelSpec, built_in_spec

if TYPE_CHECKING:
    from stages.interfaces import LayerAttention

SUPPORTED_DTYPES = tuple(DTYPE_BYTES)


def _linear(x: paddle.Tensor, weight: Weight, bias: paddle.Tensor | None) -> paddle.Tensor:
    y = project(x, weight)
    return y if bias is None else y + bias


@dataclass
class DenseMLP:
    """SwiGLU: down(silu(gate(x)) * up(x)). Gate and up are stored side by side as one
    [hidden, 2 * intermediate] weight, multiplied once, and Paddle's swiglu reads the two
    halves of the product in place, with no strided copy to split them: one op fewer a
    layer than two matmuls, and ops count at decode, where each op's launch costs more
    than its arithmetic (benchmarks/vs_llamacpp.md)."""

    gate_up: Weight  # [hidden, 2 * intermediate]: gate's columns, then up's
    down: Weight  # [intermediate, hidden]
    gate_up_bias: paddle.Tensor | None = None
    down_bias: paddle.Tensor | None = None

    @property
    def gate(self) -> paddle.Tensor:
        """Gate's weight [hidden, intermediate] (a copy): for export."""
        return paddle.chunk(dense(self.gate_up), 2, axis=1)[0]

    @property
    def up(self) -> paddle.Tensor:
        return paddle.chunk(dense(self.gate_up), 2, axis=1)[1]

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        gated = F.swiglu(_linear(x, self.gate_up, self.gate_up_bias))
        return _linear(gated, self.down, self.down_bias)


@dataclass
class MoeMLP:
    """Routed experts with top-k gating, plus always-on shared experts (ERNIE-4.5 MoE).

    The router runs in float32 and its softmax weights the chosen experts; the correction
    bias only shifts which experts are chosen. The chosen weights are renormalised to sum
    to one (their sum clamped below at norm_min)."""

    router: paddle.Tensor  # [hidden, experts], float32
    experts: list[DenseMLP]
    top_k: int
    norm_min: float
    correction_bias: paddle.Tensor | None = None  # [experts], float32
    shared: DenseMLP | None = None

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        x32 = x if x.dtype == paddle.float32 else x.astype("float32")
        probs = F.softmax(paddle.matmul(x32, self.router), axis=-1)  # [n, experts]
        scores = probs if self.correction_bias is None else probs + self.correction_bias
        _, chosen = paddle.topk(scores, self.top_k, axis=-1)  # [n, k]
        weights = paddle.take_along_axis(probs, chosen, axis=1)
        weights = weights / paddle.clip(weights.sum(axis=-1, keepdim=True), min=self.norm_min)

        # Sort the n * k (token, expert) pairs by expert, so each expert runs once on a
        # contiguous slice of its tokens; the outputs are summed back per token.
        flat = chosen.flatten()
        order = paddle.argsort(flat, stable=True)
        counts = paddle.bincount(flat, minlength=len(self.experts)).numpy()
        token_rows = order // self.top_k
        routed = paddle.gather(x, token_rows)
        outputs, start = [], 0
        for expert, count in zip(self.experts, counts.tolist(), strict=True):
            if count:
                outputs.append(expert(routed[start : start + count]))
                start += count
        pair_weights = paddle.gather(weights.flatten(), order).astype(x.dtype).unsqueeze(-1)
        out = paddle.index_add(
            paddle.zeros_like(x), token_rows, 0, paddle.concat(outputs) * pair_weights
        )
        return out if self.shared is None else out + self.shared(x)


@dataclass
class LayerWeights:
    attn_norm: paddle.Tensor
    qkv: Weight  # [hidden, (heads + 2 * kv_heads) * head_dim]
    out: Weight  # [heads * head_dim, hidden]
    mlp_norm: paddle.Tensor
    mlp: DenseMLP | MoeMLP
    qkv_bias: paddle.Tensor | None = None  # [(heads + 2 * kv_heads) * head_dim]
    out_bias: paddle.Tensor | None = None
    q_norm: paddle.Tensor | None = None  # [head_dim]: RMSNorm of each query head (Qwen3)
    k_norm: paddle.Tensor | None = None  # [head_dim]: of each key head


@dataclass
class ModelWeights:
    embed: paddle.Tensor | Int8Weight  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: paddle.Tensor
    lm_head: Weight | None  # [hidden, vocab]; None = tied to the embeddings
    lm_head_bias: paddle.Tensor | None = None


def _whole_layer(layer: LayerWeights) -> bool:
    """Whether decode_layer.cc runs the layer: int8 projections and a dense MLP."""
    mlp = layer.mlp
    return (
        isinstance(layer.out, Int8Weight)
        and isinstance(mlp, DenseMLP)
        and isinstance(mlp.gate_up, Int8Weight)
        and isinstance(mlp.down, Int8Weight)
    )


def check_dtype(dtype: str) -> None:
    """Refuses a compute dtype that Paddle cannot multiply in on the current device."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"model.dtype={dtype}: choose one of {', '.join(SUPPORTED_DTYPES)}")
    try:
        paddle.matmul(paddle.ones([1, 1], dtype=dtype), paddle.ones([1, 1], dtype=dtype))
    except Exception as err:  # Paddle raises its own NotFound error for a missing kernel
        raise ValueError(
            f"model.dtype={dtype}: Paddle has no {dtype} matmul on {paddle.get_device()}; "
            "use model.dtype=float32"
        ) from err


def transformer_lm(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position: int,
    head_dim: int,
    rope_theta: float,
    rms_eps: float,
    seed: int,
    dtype: str,
) -> TransformerLM:
    """The built-in model (`model=tiny`, `model=small`): a dense Llama-style decoder with an
    untied lm head, its weights drawn from `seed`."""
    check_dtype(dtype)
    spec = built_in_spec(
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        head_dim,
        dtype,
    )
    return TransformerLM(
        spec,
        max_position=max_position,
        rope_theta=rope_theta,
        rms_eps=rms_eps,
        dtype=dtype,
        weights=draw_weights(spec, dtype, np.random.default_rng(seed)),
    )


def draw_weights(spec: ModelSpec, dtype: str, rng: np.random.Generator) -> ModelWeights:
    """A dense, untied model's weights drawn from `rng`, in `dtype`."""
    d = spec
    if d.moe is not None or d.tied_embeddings or d.qk_norm:
        raise ValueError("only a dense, untied model's weights are drawn from a seed")
    qkv_width = (d.num_heads + 2 * d.num_kv_heads) * d.head_dim

    def normal(rows: int, cols: int, std: float) -> paddle.Tensor:
        return paddle.to_tensor(rng.normal(0.0, std, (rows, cols)).astype(dtype))

    def ones(n: int) -> paddle.Tensor:
        return paddle.ones([n], dtype=dtype)

    # Unit-variance embeddings and 1/sqrt(fan_in) projections keep logits well spread,
    # so greedy choices are far from ties and comparisons across layouts are stable.
    # The draw order is fixed: a seed gives the same weights as it always has.
    embed = normal(d.vocab_size, d.hidden_size, 1.0)
    layers = []
    for _ in range(d.num_layers):
        attn_norm = ones(d.hidden_size)
        qkv = normal(d.hidden_size, qkv_width, d.hidden_size**-0.5)
        out = normal(d.num_heads * d.head_dim, d.hidden_size, (d.num_heads * d.head_dim) ** -0.5)
        mlp_norm = ones(d.hidden_size)
        # Gate and up are drawn as one matrix, as they always were.
        gate_up = normal(d.hidden_size, 2 * d.intermediate_size, d.hidden_size**-0.5)
        down = normal(d.intermediate_size, d.hidden_size, d.intermediate_size**-0.5)
        layers.append(LayerWeights(attn_norm, qkv, out, mlp_norm, DenseMLP(gate_up, down)))
    final_norm = ones(d.hidden_size)
    lm_head = normal(d.hidden_size, d.vocab_size, d.hidden_size**-0.5)
    return ModelWeights(embed, layers, final_norm, lm_head)


class TransformerLM:
    def __init__(
        self,
        spec: ModelSpec,
        *,
        max_position: int,
        rope_theta: float,
        rms_eps: float,
        dtype: str,
        weights: ModelWeights,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_interleaved: bool = False,
        eos_ids: Iterable[int] = (),
    ) -> None:
        """The model `spec` describes, with its weights: a loaded checkpoint's, or drawn
        from a seed (draw_weights)."""
        if spec.head_dim % 2:
            raise ValueError(f"model.head_dim={spec.head_dim} must be even for rotary positions")
        check_dtype(dtype)
        self.spec = spec
        self.rms_eps = rms_eps
        self.dtype = dtype
        self.max_position = max_position
        self.rope_theta = rope_theta
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self.rope_interleaved = rope_interleaved
        self.eos_ids = frozenset(eos_ids)
        # 1 / hidden in a column: the mean of squares as a matmul (see _rms_norm).
        hidden = spec.hidden_size
        self._mean_column = paddle.full([hidden, 1], 1.0 / hidden, dtype="float32")
        self.embed = weights.embed
        self.layers = weights.layers
        self.final_norm = weights.final_norm
        self.lm_head = weights.lm_head
        self.lm_head_bias = weights.lm_head_bias
        # Each norm's weight as a [1, hidden] row, made once: a reshape a norm fewer a step.
        self._norm_rows = [
            (layer.attn_norm.reshape([1, -1]), layer.mlp_norm.reshape([1, -1]))
            for layer in self.layers
        ]
        self._final_norm_row = self.final_norm.reshape([1, -1])
        # Whether the forward takes the compiled operators (model.weights=int8 builds them).
        self.compiled = False
        self._whole: list[bool] = []  # per layer: whether decode_layer.cc runs it whole
        self.empty_bias = paddle.zeros([0], dtype="float32")  # the compiled ops' "no bias"
        self._init_rope()

    def store_int8(self) -> None:
        """Every projection (QKV, output, dense MLPs) and the lm head (the embedding, where
        tied) as int8 rows with a scale per output (stages/model/int8_weight.py), the
        float32 ones freed: the bytes a decode reads. Weights a loader stored as int8
        already stay as they are."""
        if self.dtype != "float32":
            raise ValueError(f"model.weights=int8 takes model.dtype=float32, not {self.dtype}")
        kernel()  # built (or found built) now: a missing compiler stops the run at start
        self.compiled = True

        def rounded(weight: Weight) -> Int8Weight:
            return weight if isinstance(weight, Int8Weight) else Int8Weight.of_matrix(weight)

        for layer in self.layers:
            layer.qkv, layer.out = rounded(layer.qkv), rounded(layer.out)
        for mlp in self._dense_mlps():
            mlp.gate_up, mlp.down = rounded(mlp.gate_up), rounded(mlp.down)
        if self.lm_head is not None:
            self.lm_head = rounded(self.lm_head)
        elif not isinstance(self.embed, Int8Weight):
            self.embed = Int8Weight.of_rows(self.embed)
        self._whole = [_whole_layer(layer) for layer in self.layers]

    def _dense_mlps(self) -> list[DenseMLP]:
        mlps = [layer.mlp for layer in self.layers if isinstance(layer.mlp, DenseMLP)]
        for moe in (layer.mlp for layer in self.layers if isinstance(layer.mlp, MoeMLP)):
            mlps += [*moe.experts, *([moe.shared] if moe.shared is not None else [])]
        return mlps

    def use_threads(self, threads: int) -> None:
        """The int8 operator's threads (Paddle's own are set process-wide): the run's
        num_threads."""
        weights = [self.embed, self.lm_head]
        weights += [w for layer in self.layers for w in (layer.qkv, layer.out)]
        weights += [w for mlp in self._dense_mlps() for w in (mlp.gate_up, mlp.down)]
        for weight in weights:
            if isinstance(weight, Int8Weight):
                weight.threads = threads

    @property
    def num_parameters(self) -> int:
        return self.spec.num_parameters()

    @property
    def num_bytes(self) -> int:
        """The weights' memory in their dtypes (the router stays float32 in any dtype)."""
        return sum(math.prod(t.shape) * t.element_size() for t in self._tensors())

    def _tensors(self) -> Iterator[paddle.Tensor]:
        def walk(node) -> Iterator[paddle.Tensor]:
            if isinstance(node, paddle.Tensor):
                yield node
            elif isinstance(node, Int8Weight):
                yield from (node.rows, node.scales)
            elif isinstance(node, list):
                for item in node:
                    yield from walk(item)
            elif isinstance(node, (DenseMLP, MoeMLP, LayerWeights)):
                for f in fields(node):
                    yield from walk(getattr(node, f.name))

        yield from walk([self.embed, self.layers, self.final_norm, self.lm_head, self.lm_head_bias])

    def _init_rope(self) -> None:
        inv_freq = rope_inv_freq(self.spec.head_dim, self.rope_theta, self.rope_scaling)
        angles = np.outer(np.arange(self.max_position, dtype=np.float64), inv_freq)
        if self.rope_interleaved:  # pair i is dims (2i, 2i + 1)
            angles = np.repeat(angles, 2, axis=-1)
        else:  # pair i is dims (i, i + head_dim / 2)
            angles = np.concatenate([angles, angles], axis=-1)
        self.cos = paddle.to_tensor(np.cos(angles).astype(np.float32)).astype(self.dtype)
        self.sin = paddle.to_tensor(np.sin(angles).astype(np.float32)).astype(self.dtype)

    def _rms_norm(self, x: paddle.Tensor, weight_row: paddle.Tensor) -> paddle.Tensor:
        """x * rsqrt(mean(x^2) + eps) * weight, in float32 (half-precision squares overflow).

        The mean of squares is a matmul with a 1/hidden column and the scaling an outer
        product: Paddle's CPU row reductions, `pow` and broadcasting multiplies are many
        times slower than its matmuls (benchmarks/results.md, "Design measurements").
        Paddle's fused RMSNorm kernel is not used: on a CPU it executes AVX-512
        instructions whatever the processor, and dies where they are missing."""
        x32 = x if x.dtype == paddle.float32 else x.astype("float32")
        inv_rms = paddle.rsqrt(paddle.matmul(x32 * x32, self._mean_column) + self.rms_eps)
        if x.dtype == paddle.float32:
            return x32 * paddle.matmul(inv_rms, weight_row)
        return (x32 * inv_rms).astype(x.dtype) * weight_row

    def _layers(self, h, attention: LayerAttention, state, rows: paddle.Tensor) -> paddle.Tensor:
        """The decoder layers in Paddle ops, then the final norm of `rows`."""
        for index, (layer, (attn_norm, mlp_norm)) in enumerate(
            zip(self.layers, self._norm_rows, strict=True)
        ):
            # QKV and RoPE belong to the attention stage's ops: the HPU fuses them.
            x = self._rms_norm(h, attn_norm)
            q, k, v = attention.qkv_rope(index, x, state)
            attended = attention.attend(index, q, k, v, state, out_weight=layer.out)
            h = h + (attended if layer.out_bias is None else attended + layer.out_bias)
            h = h + layer.mlp(self._rms_norm(h, mlp_norm))
        return self._rms_norm(paddle.gather(h, rows), self._final_norm_row)

    @paddle.no_grad()
    def forward(self, meta: ForwardMeta, attention: LayerAttention) -> paddle.Tensor:
        """Logits [rows, vocab] for meta.logits_rows: each chunk's last token, each decode."""
        # Where the attention packs rows, the step holds its real tokens alone (meta.packed)
        # and every layer runs on those.
        if isinstance(self.embed, Int8Weight):
            h = self.embed.row_values(meta.input_ids)
        else:
            h = paddle.gather(self.embed, meta.input_ids)
        cos = paddle.gather(self.cos, meta.positions)  # [tokens, head_dim]
        sin = paddle.gather(self.sin, meta.positions)
        state = attention.prepare(meta, cos, sin)
        if self.compiled:
            last = compiled_layers(self, h, attention, state, meta.logits_rows, self._whole)
        else:
            last = self._layers(h, attention, state, meta.logits_rows)
        if self.lm_head is not None:
            logits = project(last, self.lm_head)
        elif isinstance(self.embed, Int8Weight):  # tied: the embedding's rows are the outputs
            logits = self.embed.matmul(last)
        else:
            logits = paddle.matmul(last, self.embed, transpose_y=True)
        return logits if self.lm_head_bias is None else logits + self.lm_head_bias
