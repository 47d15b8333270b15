"""Forward metadata: a step plan laid out in the static, padded shapes an HPU executes.

The prefill part (FastDeploy's "encoder" part) holds the step's prefill chunks as a
rectangle [batch, seq] with `seq` a multiple of the block size; the decode part
(FastDeploy's "decoder" part) holds one token per decoding request. Both are padded to
buckets so that only a small set of shapes ever reaches the device. Padding rows write
their keys and values to the KV cache's scratch block, so they never touch a request's
cache. Block tables are left-aligned: key position j of a row is the j-th token of its
sequence, whatever the row's context length (FastDeploy right-aligned them while its mask
assumed left alignment, so prefills of different context lengths attended to wrong keys).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.arithmetic import ceil_div
from stages.buckets import Axis, Bucketing, Buckets, warmup_counts, warmup_graphs
from stages.host_tensor import host_tensor
from stages.kv_cache import KVCacheManager, blocks_for
from stages.request import DecodeRun, PrefillChunk, Request, StepMode, StepPlan
from stages.step_shape import StepShape, decode_totals

if TYPE_CHECKING:
    import paddle


@dataclass
class PrefillMeta:
    batch: int  # real rows
    shape: tuple[int, int, int]  # (batch, seq, blocks) after padding
    seq_ids: list[int]  # each real row's request (its internal sequence number)
    # [batch, seq]; packed: [num_tokens], the rows' real tokens one row after another
    input_ids: np.ndarray
    positions: np.ndarray  # as input_ids
    context_lens: np.ndarray  # [batch] tokens already cached before this chunk
    chunk_lens: np.ndarray  # [batch] real tokens of this chunk
    num_tokens: int  # real tokens, chunk_lens' sum
    # Every chunk starts on a block boundary: the cache is written in whole blocks,
    # block_indices [batch * seq / block_size] naming each block's destination. Otherwise
    # token by token, at (slot_blocks, slot_offsets) [batch * seq]. Packed: the blocks that
    # hold tokens only, filled from the packed rows block_rows [blocks * block_size] (a
    # last block's tail repeats its row's last token, masked until later tokens overwrite
    # it), and the real tokens' slots only.
    block_indices: paddle.Tensor | None
    slot_blocks: paddle.Tensor | None
    slot_offsets: paddle.Tensor | None
    has_context: bool
    block_list: paddle.Tensor | None  # [batch, blocks] context then chunk blocks, left-aligned
    # [batch, 1, seq, blocks * block_size] additive, with context; None where packed (the
    # packed ops read each row's context and length instead)
    mask: paddle.Tensor | None
    block_rows: paddle.Tensor | None = None


@dataclass
class DecodeMeta:
    batch: int
    shape: tuple[int, int]  # (batch, blocks): rows and flattened block list after padding
    rows: int  # rows laid out: the bucket's, or the real ones where packed
    seq_ids: list[int]
    input_ids: np.ndarray  # [rows]
    positions: np.ndarray  # [rows]
    block_indices: paddle.Tensor  # [rows] block of the slot each row writes
    block_offsets: paddle.Tensor  # [rows] offset of that slot in its block
    block_list: paddle.Tensor  # [blocks] every row's blocks, one row after another
    block_groups: paddle.Tensor  # [blocks] the row owning each block (padding: the last)
    block_mapping: paddle.Tensor  # [blocks, rows] one-hot block -> row, zero for padding
    block_bias: paddle.Tensor  # [blocks, block_size] additive: 0 for a filled slot
    # [blocks] each block's place with rows side by side, row_width blocks a row:
    # row * row_width + its index in the row; padding blocks batch * row_width, a spare row.
    row_slots: paddle.Tensor
    row_width: int  # the most blocks any row has
    # (first, end) when block_list is the pool's blocks first..end-1 in order (a span,
    # other requests' and free blocks masked as padding) rather than listed row by row.
    block_range: tuple[int, int] | None = None


@dataclass
class ForwardMeta:
    mode: StepMode
    prefill: PrefillMeta | None
    decode: DecodeMeta | None
    # None when the builder lays out shapes only (a simulated device needs no tensors).
    input_ids: paddle.Tensor | None  # [tokens] prefill rows flattened, then decode rows
    positions: paddle.Tensor | None  # [tokens]
    logits_rows: paddle.Tensor | None  # last real token of each chunk, then every decode row
    num_tokens: int
    padded_tokens: int
    shape: StepShape  # the buckets and real lengths: what a cost model reads
    # Each part's dims before padding to its bucket (what a bucket plan is chosen from):
    # prefill [batch, seq, blocks per row], decode [batch, blocks listed or spanned].
    needed: dict[str, list[int]] = field(default_factory=dict)
    # The step's real tokens only, laid out for a backend that attends packed rows (the
    # CPU's): input_ids, positions and logits_rows then skip the padding rows.
    packed: bool = False

    @classmethod
    def of_shapes(
        cls,
        mode: StepMode,
        num_tokens: int,
        padded_tokens: int,
        shape: StepShape,
        needed: dict[str, list[int]],
    ) -> ForwardMeta:
        """A step laid out as its shapes alone, without parts or tensors (a simulated
        device's every step: positional, as keywords cost several times more here)."""
        return cls(mode, None, None, None, None, None, num_tokens, padded_tokens, shape, needed)

    @property
    def bucket(self) -> str:
        """steps.jsonl's `bucket` (bucket_label): made when read, as a probe never does."""
        return bucket_label(self.shape.prefill, self.shape.decode)

    @property
    def prefill_tokens(self) -> int:
        """Rows of the prefill part: the first this many of input_ids."""
        if self.prefill is None:
            return 0
        if self.packed:
            return self.prefill.num_tokens
        return self.prefill.shape[0] * self.prefill.shape[1]


# Where a prefill's keys and values go: (block_indices, slot_blocks, slot_offsets,
# block_rows) as PrefillMeta holds them.
PrefillWrites = tuple[
    "paddle.Tensor | None", "paddle.Tensor | None", "paddle.Tensor | None", "paddle.Tensor | None"
]

# The additive mask's score for a key a query must not see. Finite, not -inf: a row that
# sees no key (padding) then softmaxes to finite weights, which its zero output discards.
MASKED_SCORE = -1e30

AXES = ("prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch", "decode_blocks")


def decode_blocks_limit(
    max_num_seqs: int, blocks_per_seq: int, num_blocks: int, prefix_caching: bool
) -> int:
    """The most blocks a decode step lists, all rows together. Each row lists its own
    blocks, at most a full row's and at most the pool. Without prefix caching the rows'
    blocks are distinct, so the pool bounds their sum too; with it, rows sharing a cached
    prefix list its blocks once each, and the sum can exceed the pool."""
    per_row = min(blocks_per_seq, num_blocks)
    if prefix_caching:
        return max_num_seqs * per_row
    return min(num_blocks, max_num_seqs * per_row)


def derived_axes(
    block_size: int,
    max_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    num_blocks: int,
    prefix_caching: bool = False,
) -> dict[str, dict[str, int]]:
    """Each bucket axis's min, step and max as derived from the limits the scheduler
    enforces: what a 0 in the config stands for."""
    blocks_per_seq = blocks_for(max_model_len, block_size)
    decode_blocks = decode_blocks_limit(max_num_seqs, blocks_per_seq, num_blocks, prefix_caching)
    distinct = decode_blocks_limit(max_num_seqs, blocks_per_seq, num_blocks, False)
    return {
        "prefill_batch": {"min": 1, "step": 1, "max": max_num_seqs},
        "prefill_seq": {"min": block_size, "step": block_size, "max": max_tokens},
        "prefill_blocks": {"min": 1, "step": 1, "max": blocks_per_seq},
        "decode_batch": {"min": 1, "step": 1, "max": max_num_seqs},
        # past the pool only rows sharing a prefix go: linear steps end there
        "decode_blocks": {"min": 1, "step": 1, "max": decode_blocks, "dense_max": distinct},
    }


def resolve_axes(
    given: Mapping[str, Mapping[str, Any]],
    block_size: int,
    max_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    num_blocks: int,
    prefix_caching: bool = False,
) -> dict[str, Axis]:
    """Each bucket axis from its config (`sizes`, or min/step/max with 0 derived from the
    limits); a ValueError names the key to change."""
    derived = derived_axes(
        block_size, max_tokens, max_num_seqs, max_model_len, num_blocks, prefix_caching
    )
    axes = {}
    for name in AXES:
        conf = given[name]
        bounds: dict[str, Any] = {
            key: conf[key] or derived[name][key] for key in ("min", "step", "max")
        }
        if not conf["max"]:  # a derived max keeps the derived dense range
            bounds["dense_max"] = derived[name].get("dense_max", 0)
        axis = Axis(**bounds)
        sizes = [int(v) for v in (conf.get("sizes") or ())]
        if sizes:
            _check_sizes(name, sizes, block_size)
            axis = Axis(min=sizes[0], step=axis.step, max=sizes[-1], explicit=tuple(sizes))
        if not 1 <= axis.min <= axis.max or axis.step < 1:
            raise ValueError(
                f"metadata.{name}: need 1 <= min <= max and step >= 1 (0 derives a value)"
            )
        axes[name] = axis
    if axes["prefill_seq"].step % block_size or axes["prefill_seq"].min % block_size:
        raise ValueError(
            "metadata.prefill_seq.min and .step must be multiples of block_size: a chunk "
            "is padded to whole blocks"
        )
    return axes


def _check_sizes(name: str, sizes: list[int], block_size: int) -> None:
    if sizes[0] < 1 or any(a >= b for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(
            f"metadata.{name}.sizes={sizes}: give increasing positive sizes, e.g. [1, 4, 16]"
        )
    if name == "prefill_seq" and any(size % block_size for size in sizes):
        raise ValueError(
            f"metadata.prefill_seq.sizes={sizes}: each must be a multiple of "
            f"block_size={block_size}, as a chunk is padded to whole blocks"
        )


class HPUMetadataBuilder:
    def __init__(
        self,
        kv_cache: KVCacheManager,
        max_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        prefill_batch: dict[str, Any],
        prefill_seq: dict[str, Any],
        prefill_blocks: dict[str, Any],
        decode_batch: dict[str, Any],
        decode_blocks: dict[str, Any],
        bucketing: Bucketing | str,
        decode_span: float,
        max_warmup_shapes: int,
        pad_id: int = 0,
        shapes_only: bool = False,
        packed: bool = False,
    ) -> None:
        """shapes_only: build() gives the buckets and lengths but no tensors, and lists
        decode blocks row by row as the HPU's fused op takes them (a simulated device).
        packed: a step's real tokens only are laid out, for an attention stage that packs
        rows (its declared `packs_rows`); the buckets are chosen and counted as ever."""
        bs = kv_cache.block_size
        given = dict(zip(AXES, (prefill_batch, prefill_seq, prefill_blocks, decode_batch,
                                decode_blocks), strict=True))  # fmt: skip
        prefix = kv_cache.prefix is not None
        axes = resolve_axes(
            given, bs, max_tokens, max_num_seqs, max_model_len, kv_cache.num_blocks, prefix
        )
        if max_warmup_shapes < 0:
            raise ValueError(
                f"metadata.max_warmup_shapes={max_warmup_shapes}: needs 0 (no limit) or more"
            )
        self.max_warmup_shapes = max_warmup_shapes
        if decode_span < 0:
            raise ValueError(f"metadata.decode_span={decode_span}: needs 0 (off) or more")
        self.kv_cache = kv_cache
        self.block_size = bs
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self.decode_span = 0.0 if shapes_only else decode_span
        self.shapes_only = shapes_only
        self.packed = packed
        self.buckets = Buckets(bucketing, axes)

    @property
    def bucket_misses(self) -> int:
        return self.buckets.misses

    @property
    def scratch(self) -> int:
        return self.kv_cache.scratch_block

    # -- the step ----------------------------------------------------------------------------
    def build(self, plan: StepPlan) -> ForwardMeta:
        if self.shapes_only:
            return self._shapes(plan)
        needed: dict[str, list[int]] = {}
        prefill_shape = self._prefill_shape(plan.prefill, needed)
        prefill = self._prefill(plan.prefill, prefill_shape, self.packed)
        lens = decode_lens(plan)  # the scheduler's array where it has one; read once
        decode = None
        if plan.decode:
            decode = self._decode(plan.decode, lens, needed=needed, packed=self.packed)
        shape = step_shape(
            self.block_size,
            plan,
            prefill.shape if prefill else None,
            decode.shape if decode else None,
            lens,
        )
        meta = self._assemble(plan.mode, prefill, decode, plan.num_tokens, shape, self.packed)
        meta.needed = needed
        return meta

    def _shapes(self, plan: StepPlan) -> ForwardMeta:
        """The step's buckets alone, as a simulated device needs them."""
        needed: dict[str, list[int]] = {}
        prefill = self._prefill_shape(plan.prefill, needed)
        decode: tuple[int, int] | None = None
        kv: tuple[int, int] | None = None
        lens = decode_lens(plan)  # the scheduler's array where it has one; read once
        rows = len(lens)
        if rows:
            kv = decode_totals(lens, self.block_size)  # each row lists the blocks it fills
            needed["decode"] = [rows, kv[1]]
            padded_rows, width = self.buckets.fitted("decode", {"batch": rows, "blocks": kv[1]})
            decode = padded_rows, width
        padded = (prefill[0] * prefill[1] if prefill else 0) + (decode[0] if decode else 0)
        shape = step_shape(self.block_size, plan, prefill, decode, lens, kv)
        tokens = rows + sum(shape.chunk_lens)  # plan.num_tokens, from what is at hand
        return ForwardMeta.of_shapes(plan.mode, tokens, padded, shape, needed)

    def pad_decodes(self, run: DecodeRun, head: ForwardMeta | None = None) -> DecodeRun | None:
        """The run's decode buckets, step by step, as build() pads each step: as many
        steps as stay within the prepared buckets (a miss is counted by build(), one step
        at a time); None where the first step misses. `head`: the run's first step, built
        by build() (its buckets, misses counted, are the first step's)."""
        widths = self.buckets.fit_prepared("decode_blocks", run.blocks)
        if run.leaving:
            rows = self.buckets.fit_prepared("decode_batch", run.batch)
        else:  # the common run: as many rows at every step
            size, prepared = self.buckets.fit("decode_batch", run.rows)
            rows = np.full(len(widths) if prepared else 0, size)
        steps = min(len(rows), len(widths))
        if head is None:
            return run.padded(rows[:steps], widths[:steps]) if steps else None
        if not steps:  # the head alone: the steps after it grow from its rows, so miss too
            rows, widths, steps = np.zeros(1, np.int64), np.zeros(1, np.int64), 1
        rows, widths = rows[:steps], widths[:steps]  # new arrays: written in place
        rows[0], widths[0] = head.shape.decode or (0, 0)
        return run.padded(rows, widths, head)

    def dummy(
        self, prefill: tuple[int, int, int] | None, decode: tuple[int, int] | None
    ) -> ForwardMeta:
        """A step of the given bucket shapes made only of padding: what warmup runs."""
        prefill_meta = self._prefill([], prefill) if prefill else None
        decode_meta = self._decode([], np.zeros(0, dtype=np.int64), decode) if decode else None
        mode = StepMode.of(bool(prefill), bool(decode))
        shape = StepShape(self.block_size, prefill, decode)
        return self._assemble(mode, prefill_meta, decode_meta, 0, shape)

    # -- the prefill part --------------------------------------------------------------------
    def _prefill_shape(
        self, chunks: list[PrefillChunk], needed: dict[str, list[int]] | None = None
    ) -> tuple[int, int, int] | None:
        """The prefill bucket; records the dims it pads in `needed` when given."""
        if not chunks:
            return None
        bs = self.block_size
        if len(chunks) == 1:  # the common step's one chunk, without the generators
            (chunk,) = chunks
            longest, last = chunk.end - chunk.start, chunk.end
        else:
            longest, last = max(c.end - c.start for c in chunks), max(c.end for c in chunks)
        seq, blocks = blocks_for(longest, bs) * bs, blocks_for(last, bs)
        dims = {"batch": len(chunks), "seq": seq, "blocks": blocks}
        if needed is not None:
            needed["prefill"] = list(dims.values())
        batch, seq, blocks = self.buckets.fitted("prefill", dims)
        return batch, seq, blocks

    def _prefill(
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

    # -- the decode part ---------------------------------------------------------------------
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

    def _decode(
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
        input_ids[:n] = [r.all_ids[r.num_computed] for r in requests]
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

    # -- warmup ------------------------------------------------------------------------------
    def warmup_counts(self, mixed: bool, padded_budget: bool = True) -> dict[str, int]:
        """The graphs each phase of warmup_shapes compiles, counted without listing them."""
        return warmup_counts(self._sizes(), self.block_size, self.max_tokens, mixed, padded_budget)

    def warmup_shapes(self, mixed: bool, padded_budget: bool = True) -> dict[str, list[tuple]]:
        """Every prefill and decode bucket some step can pad to (padded_budget: the
        scheduler's budget bounds rows x padded width); with chunking, a coarse mixed grid
        too (one prefill row, the widest block tables), as FastDeploy warms it."""
        return warmup_graphs(self._sizes(), self.block_size, self.max_tokens, mixed, padded_budget)

    def _sizes(self) -> dict[str, list[int]]:
        return {name: [int(v) for v in values] for name, values in self.buckets.sizes.items()}

    # -- both parts --------------------------------------------------------------------------
    def _assemble(
        self,
        mode: StepMode,
        prefill: PrefillMeta | None,
        decode: DecodeMeta | None,
        num_tokens: int,
        shape: StepShape,
        packed: bool = False,
    ) -> ForwardMeta:
        ids, positions, rows = [], [], []
        offset = padded = 0
        if prefill:
            b, s, _ = prefill.shape
            ids.append(prefill.input_ids.reshape(-1))
            positions.append(prefill.positions.reshape(-1))
            lens = prefill.chunk_lens[: prefill.batch]
            rows.append(np.cumsum(lens) - 1 if packed else np.arange(prefill.batch) * s + lens - 1)
            offset = prefill.num_tokens if packed else b * s
            padded = b * s
        if decode:
            padded += decode.shape[0]
            ids.append(decode.input_ids)
            positions.append(decode.positions)
            rows.append(offset + np.arange(decode.batch))
        input_ids = np.concatenate(ids)
        logits_rows = np.concatenate(rows).astype(np.int64)
        if not logits_rows.size:
            logits_rows = np.zeros(1, dtype=np.int64)  # warmup: one row keeps the shapes valid
        return ForwardMeta(
            mode=mode,
            prefill=prefill,
            decode=decode,
            input_ids=host_tensor(input_ids),
            positions=host_tensor(np.concatenate(positions)),
            logits_rows=host_tensor(logits_rows),
            num_tokens=num_tokens,
            padded_tokens=padded,
            shape=shape,
            packed=packed,
        )


@functools.lru_cache(maxsize=4096)  # a run's steps pad to few buckets: each label made once
def bucket_label(prefill: tuple | None, decode: tuple | None) -> str:
    """steps.jsonl's `bucket`: e.g. "prefill 2x256x4 + decode 8x24"."""
    parts = [f"prefill {'x'.join(map(str, prefill))}"] if prefill else []
    parts += [f"decode {'x'.join(map(str, decode))}"] if decode else []
    return " + ".join(parts)


def bucket_dims(label: str) -> tuple[tuple | None, tuple | None]:
    """The padded (prefill, decode) dims of steps.jsonl's `bucket`, e.g.
    "prefill 2x256x4 + decode 8x24", as bucket_label writes it."""
    parts: dict[str, tuple] = {}
    for part in label.split(" + "):
        kind, _, dims = part.partition(" ")
        size = {"prefill": 3, "decode": 2}.get(kind)
        numbers = dims.split("x")
        if size != len(numbers) or kind in parts or not all(n.isdigit() for n in numbers):
            raise ValueError(f"bucket {label!r} is not 'prefill AxBxC + decode DxE'")
        parts[kind] = tuple(int(n) for n in numbers)
    return parts.get("prefill"), parts.get("decode")


def decode_lens(plan: StepPlan) -> np.ndarray:
    """Each decode row's tokens with its new one: the scheduler's array when it made one."""
    if plan.decode_lens is not None:
        return plan.decode_lens
    return np.array([r.num_computed + 1 for r in plan.decode], dtype=np.int64)


def step_shape(
    block_size: int,
    plan: StepPlan,
    prefill: tuple[int, int, int] | None,
    decode: tuple[int, int] | None,
    lens: np.ndarray,
    kv: tuple[int, int] | None = None,
) -> StepShape:
    """The step's buckets and each row's real lengths (lens: decode_lens(plan); kv: their
    decode_totals, where the caller summed them)."""
    chunks = plan.prefill
    chunk_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    if len(chunks) == 1:  # the common step's one chunk, without the comprehensions
        chunk_lens, context_lens = (chunks[0].end - chunks[0].start,), (chunks[0].start,)
    else:  # list comprehensions: a step's few chunks, read fast
        chunk_lens = tuple([c.end - c.start for c in chunks])
        context_lens = tuple([c.start for c in chunks])
    return StepShape(block_size, prefill, decode, chunk_lens, context_lens, lens, False, kv)
