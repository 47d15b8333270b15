"""The CPU prefill: a chunk attended row by row, in tiles of queries that each read only the
keys they can see (the caches' layouts: stages/model/attention/ops_cpu.py)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import paddle
import paddle.nn.functional as F

from stages.arithmetic import ceil_div
from stages.forward.forward_meta import MASKED_SCORE
from stages.forward.host_tensor import host_tensor
from stages.model.attention.cpu_tensors import dense_copies
from stages.model.int8_weight import Weight, project

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
    return host_tensor(np.triu(np.full((s, s), MASKED_SCORE, dtype=np.float32), 1)).astype(dtype)


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
    out_weight: Weight,
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
    return project(paddle.concat(pieces) if len(pieces) > 1 else pieces[0], out_weight)


def _dtype(x: paddle.Tensor) -> str:
    return str(x.dtype).split(".")[-1]


def prefill(
    q: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    out_weight: Weight,
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
    out_weight: Weight,
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
