"""The decode part of a step's metadata (FastDeploy's "decoder" part): one token per
decoding row, padded to a (rows, blocks) bucket, with the rows' KV blocks listed row by row
or, where cheaper, as one span of the pool (`decode_span`), and the tensors the paged
attention reads them by (block groups, mapping, bias, row slots). Padding rows write to
the KV cache's scratch block.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from stages.forward.buckets import Buckets
from stages.forward.forward_meta import MASKED_SCORE, DecodeMeta
from stages.forward.host_tensor import host_tensor
from stages.scheduling.kv_cache import KVCacheManager, blocks_for
from stages.scheduling.request import Request

if TYPE_CHECKING:
    import paddle


class DecodePartBuilder:
    def __init__(
        self, kv_cache: KVCacheManager, buckets: Buckets, pad_id: int, decode_span: float
    ) -> None:
        self.kv_cache = kv_cache
        self.buckets = buckets
        self.block_size = kv_cache.block_size
        self.pad_id = pad_id
        self.decode_span = decode_span

    @property
    def scratch(self) -> int:
        return self.kv_cache.scratch_block

    def _span_start(self, row_blocks: np.ndarray) -> int | None:
        """Where the decode span starts, or None to list blocks row by row: the span runs
        from the lowest to the highest of the rows' blocks, padded to its bucket, and is
        taken while that bucket is at most decode_span times the row-by-row one."""
        if not self.decode_span or not row_blocks.size:
            return None
        if np.unique(row_blocks).size < row_blocks.size:
            return None  # rows share cached prefix blocks: a span has one place per block
        low, high = int(row_blocks.min()), int(row_blocks.max()) + 1
        width, prepared = self.buckets.fit("decode_blocks", high - low)
        listed, _ = self.buckets.fit("decode_blocks", row_blocks.size)
        pool_end = self.kv_cache.num_cache_blocks  # the padded span stays inside the cache
        if not prepared or width > self.decode_span * listed or width > pool_end:
            return None
        return min(low, pool_end - width)

    def build(
        self,
        requests: list[Request],
        seq_lens: np.ndarray,
        shape: tuple[int, int] | None = None,
        needed: dict[str, list[int]] | None = None,
        packed: bool = False,
    ) -> DecodeMeta:
        """The decode part of rows with seq_lens tokens (the new one included); `shape`
        forces a bucket (warmup, where every row is padding). Records the dims it pads in
        `needed`. packed: the real rows only are laid out (the block list keeps its bucket)."""
        n = len(requests)
        counts = blocks_for(seq_lens, self.block_size)
        row_blocks = self._row_blocks(requests, counts)
        start, bucket = self._decode_bucket(n, row_blocks, shape, needed)
        rows, blocks = n if packed else bucket[0], bucket[1]
        block_list, slots = self._decode_block_list(row_blocks, start, blocks)
        owner = np.repeat(np.arange(n), counts)
        index_in_row = np.arange(row_blocks.size) - np.repeat(np.cumsum(counts) - counts, counts)
        # A row's j-th block holds seq_len - j * block_size of its tokens (all, if more).
        tokens_in_block = seq_lens[owner] - index_in_row * self.block_size
        positions = np.zeros(rows, dtype=np.int64)
        positions[:n] = seq_lens - 1
        input_ids = np.full(rows, self.pad_id, dtype=np.int64)
        last = positions[:n].tolist()  # each row's input: its token at its last position
        input_ids[:n] = [r.all_ids[p] for r, p in zip(requests, last, strict=True)]
        row_width = max(1, int(counts.max(initial=0)))
        return DecodeMeta(
            batch=n,
            shape=bucket,
            rows=rows,
            seq_ids=[r.seq_id for r in requests],
            input_ids=input_ids,
            positions=positions,
            **self._decode_writes(row_blocks, counts, positions, rows),
            block_list=host_tensor(block_list),
            block_groups=host_tensor(self._scatter(blocks, slots, owner, rows - 1)),
            block_mapping=host_tensor(self._mapping(blocks, rows, slots, owner)),
            block_bias=host_tensor(self._bias(blocks, slots, tokens_in_block)),
            row_slots=host_tensor(
                self._scatter(blocks, slots, owner * row_width + index_in_row, rows * row_width)
            ),
            row_width=row_width,
            block_range=None if start is None else (start, start + blocks),
        )

    def _decode_bucket(
        self,
        n: int,
        row_blocks: np.ndarray,
        shape: tuple[int, int] | None,
        needed: dict[str, list[int]] | None,
    ) -> tuple[int | None, tuple[int, int]]:
        """(where the decode span starts or None, the (rows, blocks) bucket) of n rows
        holding row_blocks; `shape` forces the bucket and lists blocks row by row."""
        if shape is not None:
            return None, shape
        start = self._span_start(row_blocks)
        blocks_needed = row_blocks.size if start is None else int(np.ptp(row_blocks)) + 1
        if needed is not None:
            needed["decode"] = [n, blocks_needed]
        rows, blocks = self.buckets.shape("decode", batch=n, blocks=blocks_needed)
        return start, (rows, blocks)

    def _row_blocks(self, requests: list[Request], counts: np.ndarray) -> np.ndarray:
        """Every row's blocks that hold its tokens, one row after another."""
        tables = (self.kv_cache.block_table(r)[:c] for r, c in zip(requests, counts, strict=True))
        return np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int64)

    def _decode_block_list(
        self, row_blocks: np.ndarray, start: int | None, blocks: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(block_list [blocks], where each row block sits in it): listed row by row, or
        each at its place in the span, whose other blocks (free, or another request's)
        stay masked padding."""
        if start is None:
            block_list = np.full(blocks, self.scratch, dtype=np.int64)
            block_list[: row_blocks.size] = row_blocks
            return block_list, np.arange(row_blocks.size)
        return np.arange(start, start + blocks, dtype=np.int64), row_blocks - start

    @staticmethod
    def _scatter(size: int, slots: np.ndarray, values: np.ndarray, fill: int) -> np.ndarray:
        out = np.full(size, fill, dtype=np.int64)
        out[slots] = values
        return out

    @staticmethod
    def _mapping(blocks: int, rows: int, slots: np.ndarray, owner: np.ndarray) -> np.ndarray:
        mapping = np.zeros((blocks, rows), dtype=np.float32)
        mapping[slots, owner] = 1.0
        return mapping

    def _bias(self, blocks: int, slots: np.ndarray, tokens_in_block: np.ndarray) -> np.ndarray:
        """[blocks, block_size] additive: 0 for the slots of each listed block that hold
        tokens (its first tokens_in_block of them), masked elsewhere and for padding."""
        filled = np.zeros(blocks, dtype=np.int64)
        filled[slots] = tokens_in_block
        visible = np.arange(self.block_size)[None, :] < filled[:, None]
        return np.where(visible, 0.0, MASKED_SCORE).astype(np.float32)

    def _decode_writes(
        self, row_blocks: np.ndarray, counts: np.ndarray, positions: np.ndarray, rows: int
    ) -> dict[str, paddle.Tensor]:
        """Each row writes its new token into the last of its blocks; padding, to scratch."""
        n = counts.size
        write_blocks = np.full(rows, self.scratch, dtype=np.int64)
        write_blocks[:n] = row_blocks[np.cumsum(counts) - 1]
        offsets = np.where(np.arange(rows) < n, positions % self.block_size, 0)
        return {
            "block_indices": host_tensor(write_blocks),
            "block_offsets": host_tensor(offsets),
        }
