"""The dense reference: one request at a time, its keys in a plain growing tensor, no paging.

It reads only the real tokens of each row, so it shares nothing with the paged path but the
layout of the step's rows. Tests compare every other configuration against it.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

from stages.metadata import ForwardMeta


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
    weight: paddle.Tensor,
    bias: paddle.Tensor | None,
    cos: paddle.Tensor,
    sin: paddle.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    interleaved: bool,
    qk_norm: tuple[paddle.Tensor, paddle.Tensor, float] | None = None,
) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """The QKV projection and rotary positions in the checkpoint's own layout; qk_norm
    (q weight [D], k weight [D], eps) RMS-norms each query and key head first."""
    qkv = paddle.matmul(x, weight)
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


class ReferenceAttention:
    def __init__(self, num_layers: int, **_unused) -> None:
        self.keys: list[dict[str, paddle.Tensor]] = [{} for _ in range(num_layers)]
        self.values: list[dict[str, paddle.Tensor]] = [{} for _ in range(num_layers)]

    def _attend(self, layer: int, rid: str, start: int, q, k, v) -> paddle.Tensor:
        """q [n, H, D] at positions start..start+n-1 of request rid -> [n, H*D]."""
        if start == 0:  # a new request, or one recomputed after preemption
            self.keys[layer][rid] = k
            self.values[layer][rid] = v
        else:
            cached = self.keys[layer][rid]
            if cached.shape[0] != start:
                raise RuntimeError(
                    f"{rid}: cache holds {cached.shape[0]} tokens, step starts at {start}"
                )
            self.keys[layer][rid] = paddle.concat([cached, k])
            self.values[layer][rid] = paddle.concat([self.values[layer][rid], v])
        keys, values = self.keys[layer][rid], self.values[layer][rid]
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

    qkv_rope = staticmethod(qkv_rope)

    def forward(self, layer: int, q, k, v, meta: ForwardMeta, out_weight) -> paddle.Tensor:
        out = paddle.zeros([q.shape[0], q.shape[1] * q.shape[2]], dtype=q.dtype)
        if meta.encoder:
            enc = meta.encoder
            seq = enc.shape[1]
            for r in range(enc.batch):
                lo, n = r * seq, int(enc.chunk_lens[r])
                rows = slice(lo, lo + n)
                start = int(enc.context_lens[r])
                out[rows] = self._attend(
                    layer, enc.request_ids[r], start, q[rows], k[rows], v[rows]
                )
        if meta.decoder:
            dec = meta.decoder
            base = meta.encoder_tokens
            for r in range(dec.batch):
                row = slice(base + r, base + r + 1)
                start = int(dec.positions[r])
                out[row] = self._attend(layer, dec.request_ids[r], start, q[row], k[row], v[row])
        return paddle.matmul(out, out_weight)

    def release(self, request_id: str) -> None:
        for layer in range(len(self.keys)):
            self.keys[layer].pop(request_id, None)
            self.values[layer].pop(request_id, None)
