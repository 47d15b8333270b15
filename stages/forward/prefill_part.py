"""The prefill part of the forward metadata (FastDeploy's "encoder" part): a step's prefill
chunks laid out in their bucket's [batch, seq] rectangle, or packed as their real tokens
only, with where each chunk's keys and values go and, with context, the additive mask.
The metadata builder (stages/forward/metadata.py) chooses the bucket and calls it.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from stages.arithmetic import ceil_div
from stages.forward.forward_meta import MASKED_SCORE, PrefillMeta
from stages.forward.host_tensor import host_tensor
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import PrefillChunk, Request

if TYPE_CHECKING:
    import paddle

# Where a prefill's keys and values go: (block_indices, slot_blocks, slot_offsets,
# block_rows) as PrefillMeta holds them.
PrefillWrites = tuple[
    "paddle.Tensor | None", "paddle.Tensor | None", "paddle.Tensor | None", "paddle.Tensor | None"
]


class PrefillPartBuilder:
    """Lays out prefill parts whose padding writes to the KV cache's scratch block."""

    def __init__(self, kv_cache: KVCacheManager, pad_id: int = 0) -> None:
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.pad_id = pad_id

    @property
    def scratch(self) -> int:
        return self.kv_cache.scratch_block

    def build(
        self, chunks: list[PrefillChunk], shape: tuple[int, int, int] | None, packed: bool = False
    ) -> PrefillMeta | None:
        """The prefill part in a bucket `shape` (warmup passes one with no chunks); packed:
        its real tokens only."""
        if shape is None:
            return None
        rows, seq, blocks = shape
        bs = self.block_size
        context_lens = np.zeros(rows, dtype=np.int64)
        chunk_lens = np.zeros(rows, dtype=np.int64)
        context_lens[: len(chunks)] = [c.start for c in chunks]
        chunk_lens[: len(chunks)] = [c.length for c in chunks]
        # Wide enough for every block a padded chunk touches, so padding stays in the table.
        width = max(blocks, int((context_lens // bs).max()) + seq // bs + 1)
        tables = self._padded_tables([c.request for c in chunks], rows, width)
        if packed:
            input_ids, positions, writes = self._packed_prefill(
                chunks, context_lens, chunk_lens, tables
            )
        else:
            input_ids, positions, writes = self._padded_prefill(
                chunks, context_lens, chunk_lens, tables, seq
            )
        # Warmup compiles the with-context path for every shape that has room for context.
        has_context = bool(context_lens.any()) if chunks else blocks * bs > seq
        context_tables = tables[:, :blocks]
        return PrefillMeta(
            batch=len(chunks),
            shape=(rows, seq, blocks),
            seq_ids=[c.request.seq_id for c in chunks],
            input_ids=input_ids,
            positions=positions,
            context_lens=context_lens,
            chunk_lens=chunk_lens,
            num_tokens=int(chunk_lens.sum()),
            block_indices=writes[0],
            slot_blocks=writes[1],
            slot_offsets=writes[2],
            block_rows=writes[3],
            has_context=has_context,
            block_list=host_tensor(context_tables) if has_context else None,
            mask=self._context_mask(context_lens, blocks, seq)
            if has_context and not packed
            else None,
        )

    def _padded_prefill(
        self,
        chunks: list[PrefillChunk],
        context_lens: np.ndarray,
        chunk_lens: np.ndarray,
        tables: np.ndarray,
        seq: int,
    ) -> tuple[np.ndarray, np.ndarray, PrefillWrites]:
        """Ids and positions [rows, seq], padding rows and tails included, and the writes."""
        input_ids = np.full((len(context_lens), seq), self.pad_id, dtype=np.int64)
        for r, c in enumerate(chunks):
            input_ids[r, : c.length] = c.request.all_ids[c.start : c.end]
        # Positions run on from each row's own context length; padding stays in range.
        positions = context_lens[:, None] + np.arange(seq)
        real = np.arange(seq)[None, :] < chunk_lens[:, None]
        writes = self._prefill_writes(context_lens, chunk_lens, tables, positions, real)
        return input_ids, np.where(real, positions, 0), writes

    def _packed_prefill(
        self,
        chunks: list[PrefillChunk],
        context_lens: np.ndarray,
        chunk_lens: np.ndarray,
        tables: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, PrefillWrites]:
        """Ids and positions of the real tokens, one row after another, and their writes:
        whole blocks (those that hold tokens, filled from the packed rows) when every chunk
        starts on a block boundary, else token slots. Two gathers and a block write take
        half as long as writing the tokens slot by slot."""
        bs, n = self.block_size, len(chunks)
        lens = chunk_lens[:n]
        starts = np.cumsum(lens) - lens  # each row's first packed token
        input_ids = np.fromiter(
            itertools.chain.from_iterable(c.request.all_ids[c.start : c.end] for c in chunks),
            dtype=np.int64,
            count=int(lens.sum()),
        )
        row_of = np.repeat(np.arange(n), lens)
        positions = context_lens[row_of] + np.arange(row_of.size) - starts[row_of]
        if (context_lens % bs).any():
            blocks_of = tables[row_of, positions // bs]
            return (
                input_ids,
                positions,
                (None, host_tensor(blocks_of), host_tensor(positions % bs), None),
            )
        used = ceil_div(lens, bs)
        block_row = np.repeat(np.arange(n), used)
        block_j = np.arange(block_row.size) - np.repeat(np.cumsum(used) - used, used)
        dest = tables[block_row, context_lens[block_row] // bs + block_j]
        # slot k of a row's block j holds its token j * bs + k; past the row's end, its last
        in_row = np.minimum(block_j[:, None] * bs + np.arange(bs), lens[block_row][:, None] - 1)
        fill = (starts[block_row][:, None] + in_row).reshape(-1)
        return input_ids, positions, (host_tensor(dest), None, None, host_tensor(fill))

    def _padded_tables(self, requests: list[Request], rows: int, blocks: int) -> np.ndarray:
        """[rows, blocks] block tables, left-aligned, padded with the scratch block."""
        padded = np.full((rows, blocks), self.scratch, dtype=np.int64)
        for r, request in enumerate(requests):
            table = self.kv_cache.block_table(request)[:blocks]
            padded[r, : len(table)] = table
        return padded

    def _prefill_writes(
        self,
        context_lens: np.ndarray,
        chunk_lens: np.ndarray,
        tables: np.ndarray,
        positions: np.ndarray,
        real: np.ndarray,
    ) -> PrefillWrites:
        """Where the chunk's keys and values go: (block_indices, None, None, None) when
        every chunk starts on a block boundary, else token slots (None, blocks, offsets,
        None)."""
        bs = self.block_size
        seq_blocks = positions.shape[1] // bs
        if not (context_lens % bs).any():
            # A chunk's j-th block is its row's block ctx / bs + j; beyond the chunk, scratch.
            first = context_lens[:, None] // bs + np.arange(seq_blocks)
            used = np.arange(seq_blocks)[None, :] * bs < chunk_lens[:, None]
            dest = np.where(used, np.take_along_axis(tables, first, axis=1), self.scratch)
            return host_tensor(dest.reshape(-1)), None, None, None
        token_blocks = np.take_along_axis(tables, positions // bs, axis=1)
        blocks_of = np.where(real, token_blocks, self.scratch)
        offsets = np.where(real, positions % bs, np.arange(positions.shape[1]) % bs)
        return None, host_tensor(blocks_of.reshape(-1)), host_tensor(offsets.reshape(-1)), None

    def _context_mask(self, context_lens: np.ndarray, blocks: int, seq: int) -> paddle.Tensor:
        """The mask of a prefill with context: key j is the j-th token of the sequence,
        visible to query i iff j <= ctx + i."""
        keys = blocks * self.block_size
        visible = np.arange(keys)[None, None, :] <= (
            context_lens[:, None, None] + np.arange(seq)[None, :, None]
        )
        return host_tensor(np.where(visible, 0.0, MASKED_SCORE).astype(np.float32)[:, None])
