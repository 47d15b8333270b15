"""The attention ops in plain Paddle: the CPU side of the ops interface, bound here.

This module holds the caches, the q/k/v projection with its rotation, and the cache writes;
a prefill chunk is attended row by row, in tiles of queries that each read only the keys
they can see (cpu_prefill.py); a decode is vectorised over the batch (cpu_decode.py).

A layer's CPU value cache is [num_blocks, kv_heads, block_size, head_dim]: FastDeploy's
[num_blocks, block_size, kv_heads, head_dim] with each block stored head by head, so that
a gathered block is a batch of per-head [block_size, head_dim] matrices, ready for a
batched matmul, and a gather copies whole contiguous blocks. The key cache stores each
head's block transposed, [num_blocks, kv_heads, head_dim, block_size]: a decode's scores
are then queries [G, D] @ keys [D, bs], a form MKL's batched matmul runs at the speed the
memory delivers the keys, where keys [bs, D] @ queries^T [D, G] (G = 2) take far longer
(figures for this and the choices below: benchmarks/results.md, "Design measurements"). Paddle's CPU
transposes of more than three axes, and adds that broadcast over middle axes, are many
times slower than the arithmetic at these sizes; the layouts here avoid both.
Grouped-query attention never repeats keys: a KV head's G queries are matmul'd together.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import paddle

# The attention ops proper, bound here with the rest of the interface.
from stages.model.attention.cpu_decode import DecodeLayout as DecodeLayout
from stages.model.attention.cpu_decode import decode as decode
from stages.model.attention.cpu_decode import decode_layout as decode_layout
from stages.model.attention.cpu_prefill import QUERY_TILE as QUERY_TILE
from stages.model.attention.cpu_prefill import PrefillLayout as PrefillLayout
from stages.model.attention.cpu_prefill import prefill as prefill
from stages.model.attention.cpu_prefill import prefill_layout as prefill_layout
from stages.model.attention.cpu_prefill import prefill_with_context as prefill_with_context
from stages.model.attention.interface import Heads
from stages.model.int8_weight import Int8Weight, Weight, project

supports_qk_norm = True
# The prefill and decode ops take a step's real tokens packed (no static shapes to keep
# on a CPU), so the dense layers skip the padding.
packs_rows = True
# The caches' layouts are the ones stages/model/decode_layer.cc reads and writes.
compiled_decode = True


def new_caches(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """(keys [NB, KV, D, bs], values [NB, KV, bs, D]), zeroed."""
    return (
        paddle.zeros([num_blocks, num_kv_heads, head_dim, block_size], dtype=dtype),
        paddle.zeros([num_blocks, num_kv_heads, block_size, head_dim], dtype=dtype),
    )


def head_dim_order(head_dim: int, interleaved: bool) -> np.ndarray:
    """The order of a query or key head's dims in this backend: each rotary pair side by
    side, (i, i + D/2) for rotate-half (pairs (2i, 2i+1) already are)."""
    if interleaved:
        return np.arange(head_dim)
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half, head_dim)], axis=1).reshape(-1)


def pack_qkv(
    weight: Weight,
    bias: paddle.Tensor | None,
    heads: Heads,
) -> tuple[Weight, paddle.Tensor | None]:
    """Query and key columns reordered head by head so that each rotary pair is adjacent:
    qkv_rope then rotates with one complex multiply instead of slicing and concatenating
    halves (Paddle's CPU copies of strided halves cost more than the matmul at 2048 rows)."""
    num_heads, num_kv_heads, head_dim, interleaved = heads
    order = head_dim_order(head_dim, interleaved)
    rotary_heads = num_heads + num_kv_heads
    columns = np.concatenate(
        [h * head_dim + order for h in range(rotary_heads)]
        + [np.arange(rotary_heads * head_dim, (num_heads + 2 * num_kv_heads) * head_dim)]
    )
    index = paddle.to_tensor(columns)
    packed_bias = None if bias is None else paddle.gather(bias, index)
    if isinstance(weight, Int8Weight):  # int8 rows are the outputs
        return weight.outputs(index), packed_bias
    return paddle.gather(weight, index, axis=1), packed_bias


class QkNorm(NamedTuple):
    weight: paddle.Tensor  # [H + KV, D]: each query head's weight, then each key head's
    mean_column: paddle.Tensor  # [D, 1] of 1 / D: a head's mean of squares as a matmul
    eps: float


def pack_qk_norm(
    q_weight: paddle.Tensor, k_weight: paddle.Tensor, eps: float, heads: Heads
) -> QkNorm:
    """The q and k norm weights in pack_qkv's order of a head's dims, one row per rotary
    head, so qkv_rope scales all heads with one multiply that broadcasts over tokens only."""
    index = paddle.to_tensor(head_dim_order(heads.head_dim, heads.interleaved))
    q, k = paddle.gather(q_weight, index), paddle.gather(k_weight, index)
    rows = paddle.concat([q.tile([heads.num_heads, 1]), k.tile([heads.num_kv_heads, 1])])
    mean_column = paddle.full([heads.head_dim, 1], 1.0 / heads.head_dim, dtype="float32")
    return QkNorm(rows, mean_column, eps)


def _norm_heads(heads: paddle.Tensor, norm: QkNorm) -> paddle.Tensor:
    """RMSNorm over each head of heads [T, H + KV, D], in float32 as the model's norms."""
    x32 = heads if heads.dtype == paddle.float32 else heads.astype("float32")
    inv_rms = paddle.rsqrt(paddle.matmul(x32 * x32, norm.mean_column) + norm.eps)
    return (x32 * inv_rms).astype(heads.dtype) * norm.weight


def rope_table(
    cos: paddle.Tensor,
    sin: paddle.Tensor,
    heads: Heads,
) -> paddle.Tensor:
    """Each rotary pair's turn cos + i sin, tiled over the query and key heads: complex
    [T, H + KV, D / 2]."""
    num_heads, num_kv_heads, head_dim, interleaved = heads
    t, half = cos.shape[0], head_dim // 2
    rotary_heads = num_heads + num_kv_heads
    # cos and sin [T, D] hold each pair's angle twice; one of each pair makes the turn.
    if interleaved:
        cos, sin = cos[:, 0::2], sin[:, 0::2]
    else:
        cos, sin = cos[:, :half], sin[:, :half]
    # Tiled over the heads as real numbers, then viewed as complex: Paddle's CPU expand and
    # broadcasting multiply are many times slower on complex or middle axes.
    pair_turns = paddle.stack([cos, sin], axis=-1).reshape([t, 1, head_dim])
    turn = paddle.tile(pair_turns, [1, rotary_heads, 1])
    return paddle.as_complex(turn.reshape([t, rotary_heads, half, 2]))


def qkv_rope(
    x: paddle.Tensor,
    weight: Weight,
    bias: paddle.Tensor | None,
    rope: paddle.Tensor,
    heads: Heads,
    qk_norm: QkNorm | None = None,
) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """weight and bias as pack_qkv made them: each rotary pair (a, b) of a head is one
    complex number a + ib, turned by rope_table's cos + i sin of its angle; heads normed
    first with qk_norm as pack_qk_norm made it."""
    num_heads, num_kv_heads, head_dim, _ = heads
    qkv = project(x, weight)
    if bias is not None:
        qkv = qkv + bias
    t, rotary_heads = x.shape[0], num_heads + num_kv_heads
    rotary, v = paddle.split(qkv, [rotary_heads * head_dim, -1], axis=-1)
    if qk_norm is not None:
        rotary = _norm_heads(rotary.reshape([t, rotary_heads, head_dim]), qk_norm)
    pairs = paddle.as_complex(rotary.reshape([t, rotary_heads, head_dim // 2, 2]))
    rotated = paddle.as_real(pairs * rope).reshape([t, rotary_heads, head_dim])
    q, k = paddle.split(rotated, [num_heads, num_kv_heads], axis=1)
    return q, k, v.reshape([t, num_kv_heads, head_dim])


def slot_index(
    k_cache: paddle.Tensor, block_indices: paddle.Tensor, block_offsets: paddle.Tensor
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """(value rows [n * KV], key elements [n * KV * D]): where token i's values go in the
    value cache's rows of D, and each of its key's dims in the key cache's elements, which
    lie bs apart in a transposed block."""
    _, kv, d, bs = k_cache.shape
    head_blocks = _head_blocks(block_indices, kv)
    offsets = block_offsets.unsqueeze(1)
    starts = (head_blocks * (d * bs) + offsets).unsqueeze(2)
    elements = (starts + paddle.arange(d) * bs).reshape([-1])
    return (head_blocks * bs + offsets).reshape([-1]), elements


def _head_blocks(block_indices: paddle.Tensor, kv: int) -> paddle.Tensor:
    """[n, KV]: each block's per-head blocks, numbered as the caches' first two axes."""
    return (block_indices * kv).unsqueeze(1) + paddle.arange(kv)


def write_slots(
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    slots: tuple[paddle.Tensor, paddle.Tensor],
    k: paddle.Tensor,
    v: paddle.Tensor,
) -> None:
    """Token i of k, v [n, KV, D] to its slot, every head, as slot_index laid them out."""
    value_rows, key_elements = slots
    _write_value_rows(v_cache, value_rows, v)
    # The reshape is a view of the cache, so the scatter writes into it.
    paddle.scatter_(k_cache.reshape([-1, 1]), key_elements, k.reshape([-1, 1]))


def _write_value_rows(v_cache: paddle.Tensor, rows: paddle.Tensor, v: paddle.Tensor) -> None:
    """v [T, KV, D] into the value cache's rows [num_blocks * KV * bs] of D values."""
    num_blocks, kv, bs, d = v_cache.shape
    paddle.scatter_(v_cache.reshape([num_blocks * kv * bs, d]), rows, v.reshape([-1, d]))


def write_blocks(
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    block_indices: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
) -> None:
    num_blocks, kv, d, bs = k_cache.shape
    n = block_indices.shape[0]
    # Each block's keys [bs, KV * D] transposed whole, one 3-axis transpose for all blocks.
    key_blocks = k.reshape([n, bs, kv * d]).transpose([0, 2, 1]).reshape([n, kv * d * bs])
    paddle.scatter_(k_cache.reshape([num_blocks, kv * d * bs]), block_indices, key_blocks)
    head_blocks = _head_blocks(block_indices, kv)
    rows = (head_blocks * bs).unsqueeze(1) + paddle.arange(bs).unsqueeze(1)  # [n, bs, KV]
    _write_value_rows(v_cache, rows.reshape([-1]), v)
