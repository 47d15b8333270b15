"""The attention ops in plain Paddle, vectorised over the batch: the CPU side of the ops interface.

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

import functools
from typing import NamedTuple

import numpy as np
import paddle
import paddle.nn.functional as F

from stages.attention.interface import Heads

_NEG = -1e30
supports_qk_norm = True


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
    weight: paddle.Tensor,
    bias: paddle.Tensor | None,
    heads: Heads,
) -> tuple[paddle.Tensor, paddle.Tensor | None]:
    """Query and key columns reordered head by head so that each rotary pair is adjacent:
    qkv_rope then rotates with one complex multiply instead of slicing and concatenating
    halves (Paddle's CPU copies of strided halves cost more than the matmul at 2048 rows)."""
    num_heads, num_kv_heads, head_dim, interleaved = heads
    order = head_dim_order(head_dim, interleaved)
    rotary_heads = num_heads + num_kv_heads
    columns = np.concatenate(
        [h * head_dim + order for h in range(rotary_heads)]
        + [np.arange(rotary_heads * head_dim, weight.shape[1])]
    )
    index = paddle.to_tensor(columns)
    packed_bias = None if bias is None else paddle.gather(bias, index)
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
    weight: paddle.Tensor,
    bias: paddle.Tensor | None,
    rope: paddle.Tensor,
    heads: Heads,
    qk_norm: QkNorm | None = None,
) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """weight and bias as pack_qkv made them: each rotary pair (a, b) of a head is one
    complex number a + ib, turned by rope_table's cos + i sin of its angle; heads normed
    first with qk_norm as pack_qk_norm made it."""
    num_heads, num_kv_heads, head_dim, _ = heads
    qkv = paddle.matmul(x, weight)
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


def _query_heads(q: paddle.Tensor, kv: int) -> paddle.Tensor:
    """q [B, S, H, D] -> [KV, G, B, S, D], pre-scaled by 1 / sqrt(D)."""
    b, s, h, d = q.shape
    heads = q.reshape([b * s, h, d]).transpose([1, 0, 2]) * (d**-0.5)  # [H, T, D]
    return heads.reshape([kv, h // kv, b, s, d])


def _softmax_attend(heads, keys, values, mask, keys_transposed: bool = False) -> paddle.Tensor:
    """heads [KV, G, B, S, D]; keys [KV, B, K, D] ([KV, B, D, K] if keys_transposed), values
    [KV, B, K, D]; mask [B, S, K] or [S, K] additive.

    Scores are [KV, G, B, S, K], so the mask broadcasts over leading axes only: Paddle's
    CPU add is many times slower when it broadcasts over a middle axis. The mask and the
    softmax work in place: scores are the step's largest tensor, and each fresh copy of it
    costs more than the arithmetic."""
    scores = paddle.matmul(heads, keys.unsqueeze(1), transpose_y=not keys_transposed)
    scores.add_(mask)
    return paddle.matmul(F.softmax_(scores, axis=-1), values.unsqueeze(1))  # [KV, G, B, S, D]


def _project(out: paddle.Tensor, out_weight: paddle.Tensor) -> paddle.Tensor:
    """[KV, G, B, S, D] -> [B * S, H * D] (plain 3-axis transposes only) @ out_weight."""
    kv, g, b, s, d = out.shape
    rows = out.reshape([kv * g, b * s, d]).transpose([1, 0, 2]).reshape([b * s, kv * g * d])
    return paddle.matmul(rows, out_weight)


def _kv_heads_first(x: paddle.Tensor) -> paddle.Tensor:
    """[B, S, KV, D] -> [KV, B, S, D]."""
    b, s, kv, d = x.shape
    return x.reshape([b * s, kv, d]).transpose([1, 0, 2]).reshape([kv, b, s, d])


@functools.lru_cache(maxsize=4)
def _causal_bias(s: int, dtype: str) -> paddle.Tensor:
    """[S, S] additive: query i sees keys 0..i. Built once per length, not once per layer
    (building it took longer than the attention it masks)."""
    return paddle.to_tensor(np.triu(np.full((s, s), _NEG, dtype=np.float32), 1)).astype(dtype)


# Causal rows at least this long are attended in two query parts, the first over its own
# keys only: 0.71 of the row takes half of the triangle, and the second part skips the
# first part's future keys. Shorter rows are not worth the extra ops.
_SPLIT_CAUSAL_FROM = 512


def prefill(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, out_weight: paddle.Tensor
) -> paddle.Tensor:
    b, s, kv = k.shape[0], k.shape[1], k.shape[2]
    causal = _causal_bias(s, str(q.dtype).split(".")[-1])
    split = int(s * 0.71) if s >= _SPLIT_CAUSAL_FROM else s
    parts = []
    for lo, hi in ((0, split), (split, s)):
        if hi > lo:  # queries lo..hi-1 see keys 0..hi-1
            out = _softmax_attend(
                _query_heads(q[:, lo:hi], kv),
                _kv_heads_first(k[:, :hi]),
                _kv_heads_first(v[:, :hi]),
                causal[lo:hi, :hi],
            )
            parts.append(_project(out, out_weight).reshape([b, hi - lo, -1]))
    rows = parts[0] if len(parts) == 1 else paddle.concat(parts, axis=1)
    return rows.reshape([b * s, -1])


def _gather_rows(cache: paddle.Tensor, block_list: paddle.Tensor) -> paddle.Tensor:
    """The value blocks of each row of block_list [B, M], as [KV, B, M * bs, D]."""
    _, kv, bs, d = cache.shape
    b, m = block_list.shape
    blocks = paddle.gather(cache, block_list.reshape([-1])).reshape([b * m, kv, bs * d])
    return blocks.transpose([1, 0, 2]).reshape([kv, b, m * bs, d])


def _gather_key_columns(k_cache: paddle.Tensor, block_list: paddle.Tensor) -> paddle.Tensor:
    """The transposed key blocks of each row of block_list [B, M], side by side as
    [KV, B, D, M * bs]: split and joined on the last axis, where one 4-axis transpose
    takes about ten times as long."""
    _, kv, d, bs = k_cache.shape
    b, m = block_list.shape
    blocks = paddle.gather(k_cache, block_list.reshape([-1])).reshape([b * m, kv, d * bs])
    by_head = blocks.transpose([1, 0, 2]).reshape([kv, b, m, d, bs])
    return paddle.concat(paddle.unbind(by_head, axis=2), axis=-1)


def prefill_with_context(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    block_list: paddle.Tensor,
    mask: paddle.Tensor,
    out_weight: paddle.Tensor,
) -> paddle.Tensor:
    keys = _gather_key_columns(k_cache, block_list)
    values = _gather_rows(v_cache, block_list)
    heads = _query_heads(q, k_cache.shape[1])
    out = _softmax_attend(heads, keys, values, mask.squeeze(1), keys_transposed=True)
    return _project(out, out_weight)


# Decode listed row by row gathers keys and values a tile of blocks at a time, sized so
# that a tile is still in cache when its matmul reads it: the gather then costs one pass
# over memory, not three.
_TILE_BYTES = 4 << 20


class DecodeLayout(NamedTuple):
    bias: paddle.Tensor  # [NB, H, bs]: expanded over heads, so that the add broadcasts nothing
    places: paddle.Tensor  # [NB, H]: each block's scores' rows in the side-by-side buffer
    row_width: int


def decode_layout(
    block_bias: paddle.Tensor,
    row_slots: paddle.Tensor,
    row_width: int,
    num_rows: int,
    num_heads: int,
) -> DecodeLayout:
    """The bias over every head, and where each (block, head) row of scores goes: head
    by head, each row (and a spare one for padding blocks) owns row_width blocks."""
    nb, bs = block_bias.shape
    per_head = (num_rows + 1) * row_width
    return DecodeLayout(
        bias=block_bias.unsqueeze(1).expand([nb, num_heads, bs]),
        places=row_slots.unsqueeze(1) + paddle.arange(num_heads) * per_head,
        row_width=row_width,
    )


def decode(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    block_list: paddle.Tensor,
    block_groups: paddle.Tensor,
    block_mapping: paddle.Tensor,
    layout: DecodeLayout,
    out_weight: paddle.Tensor,
    block_range: tuple[int, int] | None = None,
) -> paddle.Tensor:
    """Each block's scores go to its row's stretch of one buffer, rows side by side
    (decode_layout's places), where one in-place softmax normalises every row over all its
    blocks; the block mapping then sums each row's weighted values. That is fewer and
    lighter ops than combining per-block maxima and sums, as the HPU's flat attention
    does, with the same result. A
    block span (block_range) is read in place: matmuls straight over a slice of the cache
    run twice as fast as gathering the same blocks first."""
    r, h, d = q.shape
    _, kv, bs, _ = v_cache.shape
    nb = block_list.shape[0]
    q = q.reshape([r, kv, h // kv, d]) * (d**-0.5)
    q_blocks = paddle.gather(q, block_groups)  # [NB, KV, G, D]: each block's row's queries
    bias, places, row_width = layout
    per_head = (r + 1) * row_width
    if block_range is not None:
        first, end = block_range
        sections = [nb]
    else:
        tile = max(1, _TILE_BYTES // (kv * bs * d * k_cache.element_size()))
        sections = [min(tile, nb - lo) for lo in range(0, nb, tile)]

    def tiles(*tensors: paddle.Tensor) -> zip:
        # One split per tensor rather than slices per tile: op launches add up.
        parts = (paddle.split(x, sections) if len(sections) > 1 else [x] for x in tensors)
        return zip(*parts, strict=True)

    def cache_tile(cache: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
        return cache[first:end] if block_range is not None else paddle.gather(cache, ids)

    # Masked slots and unused places stay at -1e30, not -inf: a row of padding only then
    # softmaxes to finite weights, which its zero mapping discards.
    scores = paddle.full([h * per_head, bs], _NEG, dtype=q.dtype)
    for q_tile, ids, bias_tile, place_tile in tiles(q_blocks, block_list, bias, places):
        n = q_tile.shape[0]
        tile_scores = paddle.matmul(q_tile, cache_tile(k_cache, ids)).reshape([n, h, bs])
        tile_scores.add_(bias_tile)
        paddle.scatter_(scores, place_tile.reshape([-1]), tile_scores.reshape([n * h, bs]))
    F.softmax_(scores.reshape([h * (r + 1), row_width * bs]), axis=-1)
    block_out = []
    for ids, place_tile in tiles(block_list, places):
        n = ids.shape[0]
        probs = paddle.gather(scores, place_tile.reshape([-1])).reshape([n, kv, h // kv, bs])
        block_out.append(paddle.matmul(probs, cache_tile(v_cache, ids)).reshape([n, h * d]))
    block_out = paddle.concat(block_out) if len(block_out) > 1 else block_out[0]
    rows = paddle.matmul(block_mapping, block_out, transpose_x=True)  # [R, H * D]
    return paddle.matmul(rows, out_weight)
