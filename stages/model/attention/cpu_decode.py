"""The CPU decode, vectorised over the batch: every block's scores side by side in one
buffer, softmaxed in place, then each row's weighted values summed by the block mapping
(the caches' layouts: stages/model/attention/ops_cpu.py)."""

from __future__ import annotations

from typing import NamedTuple

import paddle
import paddle.nn.functional as F

from stages.forward.forward_meta import MASKED_SCORE
from stages.model.int8_weight import Weight, project

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
    scores = paddle.full([h * (num_rows + 1) * row_width, bs], MASKED_SCORE, dtype=q_blocks.dtype)
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
    out_weight: Weight,
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
    return project(rows, out_weight)
