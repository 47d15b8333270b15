"""The attention ops in plain Paddle, vectorised over the batch: the CPU side of the ops interface.

The CPU cache of a layer is head-major: one [slots, head_dim] tensor per KV head, slot =
block * block_size + offset, i.e. the reference's [num_blocks, block_size, kv_heads,
head_dim] with the head axis first. Gathering a row's keys then needs no transpose, which
Paddle's CPU kernels make expensive at these sizes. Grouped-query attention never repeats
keys: each KV head's queries are [batch, group, seq, head_dim] against its keys.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

Cache = list[paddle.Tensor]  # one [slots, head_dim] tensor per KV head


def new_cache(slots: int, num_kv_heads: int, head_dim: int, dtype: str) -> Cache:
    return [paddle.zeros([slots, head_dim], dtype=dtype) for _ in range(num_kv_heads)]


def write_cache(cache: Cache, slots: paddle.Tensor, values: paddle.Tensor) -> None:
    """Writes values [tokens, kv_heads, head_dim] at `slots` (whole blocks or single slots)."""
    for head, tensor in enumerate(cache):
        paddle.scatter_(tensor, slots, values[:, head], overwrite=True)


def _attend(q: paddle.Tensor, keys: Cache, values: Cache, mask: paddle.Tensor) -> paddle.Tensor:
    """q [B, S, H, D]; keys, values: per KV head [B, K, D]; mask [B, 1, 1, S, K] additive."""
    b, s, h, d = q.shape
    kv = len(keys)
    q = q.reshape([b, s, kv, h // kv, d]).transpose([2, 0, 3, 1, 4])  # [KV, B, G, S, D]
    mask = mask.squeeze(1)  # [B, 1, S, K]
    outs = []
    for head in range(kv):
        scores = paddle.matmul(q[head], keys[head].unsqueeze(1), transpose_y=True)
        probs = F.softmax(scores * (d**-0.5) + mask, axis=-1)
        outs.append(paddle.matmul(probs, values[head].unsqueeze(1)))  # [B, G, S, D]
    out = paddle.stack(outs, axis=1)  # [B, KV, G, S, D]
    return out.transpose([0, 3, 1, 2, 4]).reshape([b, s, h * d])


def prefill(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, mask: paddle.Tensor
) -> paddle.Tensor:
    """First chunk of every row: attend within the chunk, causally. k, v [B, S, KV, D]."""
    heads = range(k.shape[2])
    return _attend(q, [k[:, :, i] for i in heads], [v[:, :, i] for i in heads], mask)


def prefill_with_context(
    q: paddle.Tensor, k_cache: Cache, v_cache: Cache, key_slots: paddle.Tensor, mask: paddle.Tensor
) -> paddle.Tensor:
    """A later chunk: keys are the cached context plus this chunk (already written)."""
    return _attend(q, _gather(k_cache, key_slots), _gather(v_cache, key_slots), mask)


def decode(
    q: paddle.Tensor, k_cache: Cache, v_cache: Cache, key_slots: paddle.Tensor, mask: paddle.Tensor
) -> paddle.Tensor:
    """One query per row over its paged keys. q [B, H, D] -> [B, H*D]."""
    out = _attend(q.unsqueeze(1), _gather(k_cache, key_slots), _gather(v_cache, key_slots), mask)
    return out.squeeze(1)


def _gather(cache: Cache, key_slots: paddle.Tensor) -> Cache:
    b, n = key_slots.shape
    flat = key_slots.reshape([-1])
    return [paddle.gather(tensor, flat).reshape([b, n, tensor.shape[1]]) for tensor in cache]
