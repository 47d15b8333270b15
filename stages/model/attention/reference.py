"""The dense reference: one request at a time, its keys in a plain growing tensor, no paging.

It reads only the real tokens of each row, so it shares nothing with the paged path but the
layout of the step's rows. Tests compare every other configuration against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import paddle
import paddle.nn.functional as F

from stages.forward.forward_meta import ForwardMeta
from stages.model.attention.interface import Heads
from stages.model.int8_weight import Weight, project
from stages.scheduling.request import Request


def rotate(
    x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, interleaved: bool
) -> paddle.Tensor:
    """Rotary positions on x [T, heads, D], written out as the papers state them."""
    if interleaved:  # pairs (2i, 2i+1) rotate together
        pairs = x.reshape([*x.shape[:-1], -1, 2])
        rotated = paddle.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    else:  # the first half rotates with the second
        half = x.shape[-1] // 2
        rotated = paddle.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def qkv_rope(
    x: paddle.Tensor,
    weight: Weight,
    bias: paddle.Tensor | None,
    cos: paddle.Tensor,
    sin: paddle.Tensor,
    heads: Heads,
    qk_norm: tuple[paddle.Tensor, paddle.Tensor, float] | None = None,
) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """The QKV projection and rotary positions in the checkpoint's own layout; qk_norm
    (q weight [D], k weight [D], eps) RMS-norms each query and key head first."""
    num_heads, num_kv_heads, head_dim, interleaved = heads
    qkv = project(x, weight)
    if bias is not None:
        qkv = qkv + bias
    q, k, v = paddle.split(
        qkv.reshape([x.shape[0], -1, head_dim]), [num_heads, num_kv_heads, num_kv_heads], axis=1
    )
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        q, k = head_rms_norm(q, q_weight, eps), head_rms_norm(k, k_weight, eps)
    return rotate(q, cos, sin, interleaved), rotate(k, cos, sin, interleaved), v


def head_rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """x [T, heads, D] / the root mean square of each head * weight [D], in float32."""
    x32 = x.astype("float32")
    normed = x32 * paddle.rsqrt((x32 * x32).mean(axis=-1, keepdim=True) + eps)
    return normed.astype(x.dtype) * weight


@dataclass
class ReferenceStep:
    meta: ForwardMeta
    cos: paddle.Tensor
    sin: paddle.Tensor


class ReferenceAttention:
    """Keys and values per request, keyed by its internal sequence number."""

    supports_prefix_caching = False  # each request computes every one of its tokens
    packs_rows = False  # each request attends on its own; padding never joins

    def __init__(self, num_layers: int, **_unused) -> None:
        self.keys: list[dict[int, paddle.Tensor]] = [{} for _ in range(num_layers)]
        self.values: list[dict[int, paddle.Tensor]] = [{} for _ in range(num_layers)]
        self.heads: Heads | None = None
        self._qkv: list[tuple[paddle.Tensor, paddle.Tensor | None]] = []
        self._qk_norm: list[tuple[paddle.Tensor, paddle.Tensor, float] | None] = []

    def load_weights(self, model) -> None:
        """The checkpoint's own layout: nothing to pack."""
        self.heads = Heads.of(model)
        self._qkv = [(layer.qkv, layer.qkv_bias) for layer in model.layers]
        self._qk_norm = [
            None if layer.q_norm is None else (layer.q_norm, layer.k_norm, model.rms_eps)
            for layer in model.layers
        ]

    def prepare(self, meta: ForwardMeta, cos: paddle.Tensor, sin: paddle.Tensor) -> ReferenceStep:
        return ReferenceStep(meta, cos, sin)

    def qkv_rope(
        self, layer: int, x: paddle.Tensor, state: ReferenceStep
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        weight, bias = self._qkv[layer]
        return qkv_rope(x, weight, bias, state.cos, state.sin, self.heads, self._qk_norm[layer])

    def _attend(self, layer: int, seq: int, start: int, q, k, v) -> paddle.Tensor:
        """q [n, H, D] at positions start..start+n-1 of sequence seq -> [n, H*D]."""
        if start == 0:  # a new request, or one recomputed after preemption
            self.keys[layer][seq] = k
            self.values[layer][seq] = v
        else:
            cached = self.keys[layer][seq]
            if cached.shape[0] != start:
                raise RuntimeError(
                    f"sequence {seq}: cache holds {cached.shape[0]} tokens, step starts at {start}"
                )
            self.keys[layer][seq] = paddle.concat([cached, k])
            self.values[layer][seq] = paddle.concat([self.values[layer][seq], v])
        keys, values = self.keys[layer][seq], self.values[layer][seq]
        n, h, d = q.shape
        group = h // keys.shape[1]
        keys = paddle.repeat_interleave(keys, group, axis=1).transpose([1, 0, 2])  # [H, L, D]
        values = paddle.repeat_interleave(values, group, axis=1).transpose([1, 0, 2])
        scores = paddle.matmul(q.transpose([1, 0, 2]), keys, transpose_y=True) / d**0.5
        query_pos = paddle.arange(start, start + n).unsqueeze(1)
        key_pos = paddle.arange(keys.shape[1]).unsqueeze(0)
        scores = paddle.where(key_pos <= query_pos, scores, paddle.full_like(scores, float("-inf")))
        out = paddle.matmul(F.softmax(scores, axis=-1), values)  # [H, n, D]
        return out.transpose([1, 0, 2]).reshape([n, h * d])

    def attend(
        self, layer: int, q, k, v, state: ReferenceStep, out_weight: Weight
    ) -> paddle.Tensor:
        meta = state.meta
        out = paddle.zeros([q.shape[0], q.shape[1] * q.shape[2]], dtype=q.dtype)
        rows = []  # (first row, tokens, sequence, start position)
        if meta.prefill:
            seq = meta.prefill.shape[1]
            for r in range(meta.prefill.batch):
                n, start = int(meta.prefill.chunk_lens[r]), int(meta.prefill.context_lens[r])
                rows.append((r * seq, n, meta.prefill.seq_ids[r], start))
        if meta.decode:
            base = meta.prefill_tokens
            for r in range(meta.decode.batch):
                rows.append((base + r, 1, meta.decode.seq_ids[r], int(meta.decode.positions[r])))
        for lo, n, seq_id, start in rows:
            span = slice(lo, lo + n)
            out[span] = self._attend(layer, seq_id, start, q[span], k[span], v[span])
        return project(out, out_weight)

    def compiled_decode(self, layer: int, state: ReferenceStep) -> None:
        """Keys and values kept per request: the compiled decode layer never runs."""
        return None

    def release(self, request: Request) -> None:
        for layer in range(len(self.keys)):
            self.keys[layer].pop(request.seq_id, None)
            self.values[layer].pop(request.seq_id, None)
