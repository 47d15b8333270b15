"""The attention ops in plain Paddle: the CPU side of the ops interface.

A prefill chunk is attended row by row, in tiles of queries that each read only the keys
they can see; a decode is vectorised over the batch.

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

import contextlib
import functools
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import paddle
import paddle.nn.functional as F

from stages.arithmetic import ceil_div
from stages.attention.interface import Heads
from stages.host_tensor import host_tensor

_NEG = -1e30
supports_qk_norm = True
# The prefill and decode ops take a step's real tokens packed (no static shapes to keep
# on a CPU), so the dense layers skip the padding.
packs_rows = True

_STRIDE_FLAG = "FLAGS_use_stride_kernel"
try:
    _HAS_STRIDE_FLAG = _STRIDE_FLAG in paddle.get_flags([_STRIDE_FLAG])
except ValueError:  # a Paddle without strided views
    _HAS_STRIDE_FLAG = False


@contextlib.contextmanager
def dense_copies() -> Iterator[None]:
    """Transposes and slices made inside are new dense tensors, copied by Paddle's own
    transpose and slice kernels, rather than strided views. A view is copied anyway by the
    next op that needs dense input (a matmul, a reshape), and that copy, Paddle's generic
    strided one, takes several times longer (benchmarks/peer.md). Reshapes of dense
    tensors stay views either way."""
    if not _HAS_STRIDE_FLAG:
        yield
        return
    previous = paddle.get_flags([_STRIDE_FLAG])[_STRIDE_FLAG]
    paddle.set_flags({_STRIDE_FLAG: False})
    try:
        yield
    finally:
        paddle.set_flags({_STRIDE_FLAG: previous})


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


# A chunk's queries are attended this many at a time, each tile over only the keys its
# queries can see (the context, then the chunk up to the tile's last query): a causal
# chunk then costs a little over half of its full square, a row's padding costs nothing,
# and a tile's scores stay in cache from the matmul through the softmax.
QUERY_TILE = 128


class PrefillTile(NamedTuple):
    start: int  # the tile's first query in its row
    size: int  # queries
    keys: int  # keys the tile reads: the row's context + start + size
    mask: paddle.Tensor  # [size, keys] additive: query i sees keys 0..keys - size + i


class PrefillLayout(NamedTuple):
    """Each prefill row's tiles (none for a padding row), made once per step."""

    rows: tuple[tuple[PrefillTile, ...], ...]
    # Each row's first token in packed q, k, v (the rows' real tokens one after another);
    # None = the ops take the padded rectangle [B, S, ...].
    starts: tuple[int, ...] | None = None


def prefill_layout(
    context_lens: np.ndarray, chunk_lens: np.ndarray, dtype: str, packed: bool = False
) -> PrefillLayout:
    """Tiles of QUERY_TILE queries over each row's real tokens; rows with equal offsets
    share their masks. packed: the prefill ops take and give the real tokens only."""
    masks: dict[tuple[int, int], paddle.Tensor] = {}
    rows = []
    for context, length in zip(context_lens.tolist(), chunk_lens.tolist(), strict=True):
        tiles = []
        for start in range(0, length, QUERY_TILE):
            size = min(QUERY_TILE, length - start)
            seen = context + start  # keys every query of the tile sees
            if (seen, size) not in masks:
                masks[seen, size] = _tile_mask(seen, size, dtype)
            tiles.append(PrefillTile(start, size, seen + size, masks[seen, size]))
        rows.append(tuple(tiles))
    starts = tuple((np.cumsum(chunk_lens) - chunk_lens).tolist()) if packed else None
    return PrefillLayout(tuple(rows), starts)


def _tile_mask(seen: int, size: int, dtype: str) -> paddle.Tensor:
    """[size, seen + size] additive: every query sees the first `seen` keys, then the
    tile's keys up to its own."""
    causal = _causal_bias(size, dtype)
    if not seen:
        return causal
    return paddle.concat([paddle.zeros([size, seen], dtype=dtype), causal], axis=1)


@functools.lru_cache(maxsize=8)
def _causal_bias(s: int, dtype: str) -> paddle.Tensor:
    """[S, S] additive: query i sees keys 0..i. Built once per length, not once per layer
    (building it took longer than the attention it masks)."""
    return host_tensor(np.triu(np.full((s, s), _NEG, dtype=np.float32), 1)).astype(dtype)


def _attend_tile(
    queries: paddle.Tensor,
    keys: paddle.Tensor,
    values: paddle.Tensor,
    mask: paddle.Tensor,
    keys_transposed: bool,
) -> paddle.Tensor:
    """One row's queries [n, H, D] over keys [KV, K, D] ([KV, D, K] if keys_transposed) and
    values [KV, K, D], all dense, mask [n, K] additive -> [n, H * D].

    A KV head's G query heads are rows of one matmul, [KV, G * n, D]: no key is repeated,
    and the mask broadcasts over leading axes only (Paddle's CPU add is many times slower
    when it broadcasts over a middle axis). The mask and the softmax work in place."""
    n, h, d = queries.shape
    kv = values.shape[0]
    with dense_copies():
        heads = queries.transpose([1, 0, 2]).reshape([kv, h // kv * n, d]) * (d**-0.5)
    scores = paddle.matmul(heads, keys, transpose_y=not keys_transposed)  # [KV, G * n, K]
    scores.reshape([kv, h // kv, n, -1]).add_(mask)
    out = paddle.matmul(F.softmax_(scores, axis=-1), values)  # [KV, G * n, D]
    with dense_copies():
        return out.reshape([h, n, d]).transpose([1, 0, 2]).reshape([n, h * d])


def _attend_rows(
    q: paddle.Tensor,
    layout: PrefillLayout,
    row_keys_values,
    keys_transposed: bool,
    out_weight: paddle.Tensor,
) -> paddle.Tensor:
    """Every row's tiles, then one output projection: q [B, S, H, D] -> [B * S, hidden]
    with padding as zeros, or packed q [T, H, D] (layout.starts) -> [T, hidden].
    row_keys_values(row, keys) gives the row's first `keys` keys and values."""
    h, d = q.shape[-2:]
    s = 0 if layout.starts is not None else q.shape[1]
    pieces = []
    for row, tiles in enumerate(layout.rows):
        length = tiles[-1].start + tiles[-1].size if tiles else 0
        if tiles:
            keys, values = row_keys_values(row, tiles[-1].keys)
        for tile in tiles:
            with dense_copies():  # each tile's key prefix as a dense matmul operand
                if layout.starts is not None:
                    first = layout.starts[row] + tile.start
                    queries = q[first : first + tile.size]
                else:
                    queries = q[row, tile.start : tile.start + tile.size]
                tile_keys = keys[:, :, : tile.keys] if keys_transposed else keys[:, : tile.keys]
                tile_values = values[:, : tile.keys]
            pieces.append(_attend_tile(queries, tile_keys, tile_values, tile.mask, keys_transposed))
        if length < s:  # padding queries: their outputs are never read
            pieces.append(paddle.zeros([s - length, h * d], dtype=q.dtype))
    return paddle.matmul(paddle.concat(pieces) if len(pieces) > 1 else pieces[0], out_weight)


def _dtype(x: paddle.Tensor) -> str:
    return str(x.dtype).split(".")[-1]


def prefill(
    q: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    out_weight: paddle.Tensor,
    layout: PrefillLayout | None = None,
) -> paddle.Tensor:
    """layout: the rows' real lengths as prefill_layout made them (packed: q, k, v are the
    rows' real tokens one after another); None = every row full."""
    if layout is None:
        b, s = q.shape[0], q.shape[1]
        layout = prefill_layout(np.zeros(b, np.int64), np.full(b, s), _dtype(q))

    def row_keys_values(row: int, keys: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        first = layout.starts[row] if layout.starts is not None else 0
        with dense_copies():
            if layout.starts is not None:
                row_k, row_v = k[first : first + keys], v[first : first + keys]
            else:
                row_k, row_v = k[row, :keys], v[row, :keys]
            return row_k.transpose([1, 0, 2]), row_v.transpose([1, 0, 2])

    return _attend_rows(q, layout, row_keys_values, False, out_weight)


def prefill_with_context(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    block_list: paddle.Tensor,
    mask: paddle.Tensor,
    out_weight: paddle.Tensor,
    layout: PrefillLayout | None = None,
) -> paddle.Tensor:
    """layout: the rows' contexts and real lengths as prefill_layout made them; None =
    every row full, its context read from the mask (what its first query sees, less one)."""
    if layout is None:
        contexts = (mask[:, 0, 0] == 0).astype("int64").sum(axis=-1).numpy() - 1
        layout = prefill_layout(contexts, np.full(q.shape[0], q.shape[1]), _dtype(q))
    bs = k_cache.shape[-1]

    def row_keys_values(row: int, keys: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        with dense_copies():
            blocks = block_list[row, : ceil_div(keys, bs)]
            return _gather_key_columns(k_cache, blocks), _gather_rows(v_cache, blocks)

    return _attend_rows(q, layout, row_keys_values, True, out_weight)


def _gather_rows(cache: paddle.Tensor, blocks: paddle.Tensor) -> paddle.Tensor:
    """Value blocks [M] of one row as [KV, M * bs, D]."""
    _, kv, bs, d = cache.shape
    m = blocks.shape[0]
    rows = paddle.gather(cache, blocks).reshape([m, kv, bs * d])
    return rows.transpose([1, 0, 2]).reshape([kv, m * bs, d])


def _gather_key_columns(k_cache: paddle.Tensor, blocks: paddle.Tensor) -> paddle.Tensor:
    """Transposed key blocks [M] of one row side by side as [KV, D, M * bs]: split and
    joined on the last axis, where one 4-axis transpose takes about ten times as long."""
    _, kv, d, bs = k_cache.shape
    m = blocks.shape[0]
    by_head = paddle.gather(k_cache, blocks).reshape([m, kv, d * bs]).transpose([1, 0, 2])
    if m == 1:
        return by_head.reshape([kv, d, bs])
    return paddle.concat(paddle.unbind(by_head.reshape([kv, m, d, bs]), axis=1), axis=-1)


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


def _tile_sections(nb: int, block_range: tuple[int, int] | None, block_bytes: int) -> list[int]:
    """Blocks per tile of a decode: one tile for a span read in place, else tiles of a
    cache's size (_TILE_BYTES)."""
    if block_range is not None:
        return [nb]
    tile = max(1, _TILE_BYTES // block_bytes)
    return [min(tile, nb - lo) for lo in range(0, nb, tile)]


class _Tiling(NamedTuple):
    """How a decode walks its blocks: in tiles of `sections` blocks, each tile's blocks
    gathered from the cache, or a span (block_range) read in place."""

    sections: list[int]
    block_range: tuple[int, int] | None

    def split(self, *tensors: paddle.Tensor) -> zip:
        """The tensors' tiles side by side."""
        # One split per tensor rather than slices per tile: op launches add up.
        many = len(self.sections) > 1
        parts = (paddle.split(x, self.sections) if many else [x] for x in tensors)
        return zip(*parts, strict=True)

    def cache(self, cache: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
        """A tile's blocks of the cache."""
        if self.block_range is not None:
            first, end = self.block_range
            return cache[first:end]
        return paddle.gather(cache, ids)


def _block_probs(
    q_blocks: paddle.Tensor,
    k_cache: paddle.Tensor,
    block_list: paddle.Tensor,
    layout: DecodeLayout,
    tiling: _Tiling,
    num_rows: int,
) -> paddle.Tensor:
    """[H * (R + 1) * row_width, bs]: each block's scores at its place, softmaxed over its
    row's places."""
    _, kv, group, _ = q_blocks.shape
    h, bs = kv * group, k_cache.shape[-1]
    bias, places, row_width = layout
    # Masked slots and unused places stay at -1e30, not -inf: a row of padding only then
    # softmaxes to finite weights, which its zero mapping discards.
    scores = paddle.full([h * (num_rows + 1) * row_width, bs], _NEG, dtype=q_blocks.dtype)
    for q_tile, ids, bias_tile, place_tile in tiling.split(q_blocks, block_list, bias, places):
        n = q_tile.shape[0]
        tile_scores = paddle.matmul(q_tile, tiling.cache(k_cache, ids)).reshape([n, h, bs])
        tile_scores.add_(bias_tile)
        paddle.scatter_(scores, place_tile.reshape([-1]), tile_scores.reshape([n * h, bs]))
    F.softmax_(scores.reshape([h * (num_rows + 1), row_width * bs]), axis=-1)
    return scores


def _block_values(
    probs: paddle.Tensor,
    v_cache: paddle.Tensor,
    block_list: paddle.Tensor,
    places: paddle.Tensor,
    tiling: _Tiling,
) -> paddle.Tensor:
    """[NB, H * D]: each block's values weighted by its probabilities (from its places)."""
    _, kv, bs, d = v_cache.shape
    h = places.shape[1]
    block_out = []
    for ids, place_tile in tiling.split(block_list, places):
        n = ids.shape[0]
        weights = paddle.gather(probs, place_tile.reshape([-1])).reshape([n, kv, h // kv, bs])
        block_out.append(paddle.matmul(weights, tiling.cache(v_cache, ids)).reshape([n, h * d]))
    return paddle.concat(block_out) if len(block_out) > 1 else block_out[0]


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
    does, with the same result. A block span (block_range) is read in place: matmuls
    straight over a slice of the cache run twice as fast as gathering the same blocks."""
    r, h, d = q.shape
    _, kv, bs, _ = v_cache.shape
    q = q.reshape([r, kv, h // kv, d]) * (d**-0.5)
    q_blocks = paddle.gather(q, block_groups)  # [NB, KV, G, D]: each block's row's queries
    block_bytes = kv * bs * d * k_cache.element_size()
    tiling = _Tiling(_tile_sections(block_list.shape[0], block_range, block_bytes), block_range)
    probs = _block_probs(q_blocks, k_cache, block_list, layout, tiling, r)
    block_out = _block_values(probs, v_cache, block_list, layout.places, tiling)
    rows = paddle.matmul(block_mapping, block_out, transpose_x=True)  # [R, H * D]
    return paddle.matmul(rows, out_weight)
