"""The attention ops in plain Paddle, vectorised over the batch: the CPU side of the ops interface.

Grouped-query attention never repeats keys: queries are viewed as
[batch, kv_heads, group, seq, head_dim] and broadcast against [batch, kv_heads, 1, keys, head_dim].
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F


def write_cache(cache: paddle.Tensor, slots: paddle.Tensor, values: paddle.Tensor) -> None:
    """Writes values [tokens, kv_heads, head_dim] into the flat cache at `slots`."""
    paddle.scatter_(cache, slots, values, overwrite=True)


def _attend(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, mask: paddle.Tensor
) -> paddle.Tensor:
    """q [B, S, H, D]; k, v [B, K, KV, D]; mask broadcastable to [B, KV, G, S, K] -> [B, S, H*D]."""
    b, s, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    q = q.reshape([b, s, kv, g, d]).transpose([0, 2, 3, 1, 4])  # [B, KV, G, S, D]
    k = k.transpose([0, 2, 1, 3]).unsqueeze(2)  # [B, KV, 1, K, D]
    v = v.transpose([0, 2, 1, 3]).unsqueeze(2)
    scores = paddle.matmul(q, k, transpose_y=True) * (d**-0.5) + mask
    out = paddle.matmul(F.softmax(scores, axis=-1), v)  # [B, KV, G, S, D]
    return out.transpose([0, 3, 1, 2, 4]).reshape([b, s, h * d])


def prefill(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, mask: paddle.Tensor
) -> paddle.Tensor:
    """First chunk of every row: attend within the chunk, causally."""
    return _attend(q, k, v, mask)


def prefill_with_context(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    key_slots: paddle.Tensor,
    mask: paddle.Tensor,
) -> paddle.Tensor:
    """A later chunk: keys are the cached context plus this chunk (already written)."""
    return _attend(q, _gather(k_cache, key_slots), _gather(v_cache, key_slots), mask)


def decode(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    key_slots: paddle.Tensor,
    mask: paddle.Tensor,
) -> paddle.Tensor:
    """One query per row over its paged keys. q [B, H, D] -> [B, H*D]."""
    out = _attend(q.unsqueeze(1), _gather(k_cache, key_slots), _gather(v_cache, key_slots), mask)
    return out.squeeze(1)


def _gather(cache: paddle.Tensor, key_slots: paddle.Tensor) -> paddle.Tensor:
    b, n = key_slots.shape
    return paddle.gather(cache, key_slots.reshape([-1])).reshape([b, n, *cache.shape[1:]])
