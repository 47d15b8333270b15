"""Forward metadata: a step plan laid out in the static, padded shapes an HPU executes.

The encoder part holds the prefilling requests as a rectangle [batch, seq] with `seq` a
multiple of the block size; the decoder part holds one token per decoding request. Both
are padded to buckets so that only a small set of shapes ever reaches the device. Padding
rows write their keys and values to a scratch block past the pool, so they never touch a
request's cache. Block tables are left-aligned: key position j of a row is the j-th token
of its sequence, whatever the row's context length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import structlog

from stages.request import PrefillChunk, Request, StepPlan

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Axis:
    """The prepared sizes of one bucket dimension."""

    min: int
    step: int
    max: int

    def sizes(self, strategy: str) -> list[int]:
        top = -(-self.max // self.step) * self.step
        if strategy == "exponential":
            sizes, n = [], self.min
            while n < top:
                sizes.append(n)
                n *= 2
            return [*sizes, top]
        return list(range(self.min, top, self.step)) + [top]


class Buckets:
    """Finds the smallest prepared size >= n in each dimension; beyond the largest, a miss."""

    def __init__(self, strategy: str, axes: dict[str, Axis]) -> None:
        self.strategy = strategy
        self.axes = axes
        self.sizes = {name: np.array(axis.sizes(strategy)) for name, axis in axes.items()}
        self.misses = 0
        self._missed_shapes: set[tuple] = set()

    def fit(self, name: str, n: int) -> tuple[int, bool]:
        sizes = self.sizes[name]
        i = int(np.searchsorted(sizes, n))
        if i < len(sizes):
            return int(sizes[i]), True
        step = self.axes[name].step
        return -(-n // step) * step, False  # fallback: an unprepared shape, never a dropped row

    def shape(self, kind: str, **dims: int) -> tuple[int, ...]:
        fitted = [self.fit(f"{kind}_{name}", n) for name, n in dims.items()]
        shape = tuple(size for size, _ in fitted)
        if not all(hit for _, hit in fitted):
            self.misses += 1
            if (kind, shape) not in self._missed_shapes:
                self._missed_shapes.add((kind, shape))
                log.warning("bucket_miss", kind=kind, needed=dims, fallback=shape)
        return shape


@dataclass
class EncoderMeta:
    batch: int  # real rows
    shape: tuple[int, int, int]  # (batch, seq, blocks) after padding
    request_ids: list[str]
    input_ids: np.ndarray  # [batch, seq]
    positions: np.ndarray  # [batch, seq]
    context_lens: np.ndarray  # [batch] tokens already cached before this chunk
    chunk_lens: np.ndarray  # [batch] real tokens of this chunk
    # Every chunk starts on a block boundary: the cache is written in whole blocks,
    # block_indices [batch * seq / block_size] naming each block's destination. Otherwise
    # token by token, at (slot_blocks, slot_offsets) [batch * seq].
    block_indices: paddle.Tensor | None
    slot_blocks: paddle.Tensor | None
    slot_offsets: paddle.Tensor | None
    has_context: bool
    block_list: paddle.Tensor | None  # [batch, blocks] context then chunk blocks, left-aligned
    mask: paddle.Tensor | None  # [batch, 1, seq, blocks * block_size] additive, with context


@dataclass
class DecoderMeta:
    batch: int
    shape: tuple[int, int]  # (batch, blocks): rows and flattened block list after padding
    request_ids: list[str]
    input_ids: np.ndarray  # [batch]
    positions: np.ndarray  # [batch]
    seq_lens: np.ndarray  # [batch] tokens in the cache once this step's token is written
    block_indices: paddle.Tensor  # [batch] block of the slot each row writes
    block_offsets: paddle.Tensor  # [batch] offset of that slot in its block
    block_list: paddle.Tensor  # [blocks] every row's blocks, one row after another
    block_groups: paddle.Tensor  # [blocks] the row owning each block (padding: the last)
    block_mapping: paddle.Tensor  # [blocks, batch] one-hot block -> row, zero for padding
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
    mode: str  # extend, decode or mixed
    encoder: EncoderMeta | None
    decoder: DecoderMeta | None
    input_ids: paddle.Tensor  # [tokens] encoder rows flattened, then decoder rows
    positions: paddle.Tensor  # [tokens]
    logits_rows: paddle.Tensor  # last real token of each chunk, then every decode row
    num_tokens: int
    padded_tokens: int
    bucket: str

    @property
    def encoder_tokens(self) -> int:
        return self.encoder.shape[0] * self.encoder.shape[1] if self.encoder else 0


_NEG = -1e30  # additive mask; finite so that fully masked padding rows stay finite


class HPUMetadataBuilder:
    def __init__(
        self,
        block_size: int,
        max_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        num_blocks: int,
        prefill_batch: dict[str, int],
        prefill_seq: dict[str, int],
        prefill_blocks: dict[str, int],
        decode_batch: dict[str, int],
        decode_blocks: dict[str, int],
        bucketing: str = "linear",
        pad_id: int = 0,
        decode_span: float = 2.0,
    ) -> None:
        if bucketing not in ("linear", "exponential"):
            raise ValueError(
                f"metadata.bucketing={bucketing}: choose metadata.bucketing=linear or exponential"
            )
        # A 0 in a bucket axis is derived from the limits the scheduler enforces.
        blocks_per_seq = -(-max_model_len // block_size)
        derived = {
            "prefill_batch": {"min": 1, "step": 1, "max": max_num_seqs},
            "prefill_seq": {"min": block_size, "step": block_size, "max": max_tokens},
            "prefill_blocks": {"min": 1, "step": 1, "max": blocks_per_seq},
            "decode_batch": {"min": 1, "step": 1, "max": max_num_seqs},
            "decode_blocks": {
                "min": 1,
                "step": 1,
                "max": min(num_blocks, max_num_seqs * blocks_per_seq),
            },
        }
        given = {
            "prefill_batch": prefill_batch,
            "prefill_seq": prefill_seq,
            "prefill_blocks": prefill_blocks,
            "decode_batch": decode_batch,
            "decode_blocks": decode_blocks,
        }
        axes = {
            name: Axis(**{key: value or derived[name][key] for key, value in given[name].items()})
            for name in given
        }
        for name, axis in axes.items():
            if not 1 <= axis.min <= axis.max:
                raise ValueError(f"metadata.{name}: need 1 <= min <= max (0 derives a value)")
        if axes["prefill_seq"].step % block_size or axes["prefill_seq"].min % block_size:
            raise ValueError(
                "metadata.prefill_seq.min and .step must be multiples of block_size: a chunk "
                "is padded to whole blocks"
            )
        self.block_size = block_size
        self.max_tokens = max_tokens
        self.scratch_block = num_blocks  # one block past the pool takes the padding's writes
        self.pad_id = pad_id
        if decode_span < 0:
            raise ValueError(f"metadata.decode_span={decode_span}: needs 0 (off) or more")
        self.decode_span = decode_span
        self.buckets = Buckets(bucketing, axes)

    @property
    def bucket_misses(self) -> int:
        return self.buckets.misses

    def _padded_tables(self, tables: list[list[int]], rows: int, blocks: int) -> np.ndarray:
        padded = np.full((rows, blocks), self.scratch_block, dtype=np.int64)
        for r, table in enumerate(tables):
            padded[r, : min(len(table), blocks)] = table[:blocks]
        return padded

    def _encoder(
        self, chunks: list[PrefillChunk], shape: tuple[int, int, int] | None = None
    ) -> EncoderMeta:
        """The encoder part; `shape` forces a bucket (warmup, where every row is padding)."""
        bs = self.block_size
        lens = np.array([c.length for c in chunks], dtype=np.int64)
        ctx = np.array([c.start for c in chunks], dtype=np.int64)
        if shape is None:
            shape = self.buckets.shape(
                "prefill",
                batch=len(chunks),
                seq=-(-int(lens.max()) // bs) * bs,
                blocks=int((-(-(ctx + lens) // bs)).max()),
            )
        rows, seq, blocks = shape
        input_ids = np.full((rows, seq), self.pad_id, dtype=np.int64)
        context_lens = np.zeros(rows, dtype=np.int64)
        chunk_lens = np.zeros(rows, dtype=np.int64)
        context_lens[: len(chunks)] = ctx
        chunk_lens[: len(chunks)] = lens
        for r, c in enumerate(chunks):
            input_ids[r, : c.length] = c.request.all_ids[c.start : c.end]
        # Wide enough for every block a padded chunk touches, so padding stays in the table.
        table_width = max(blocks, int((context_lens // bs).max()) + seq // bs + 1)
        tables = self._padded_tables([c.request.block_table for c in chunks], rows, table_width)
        # Positions run on from each row's own context length; padding stays in range.
        positions = context_lens[:, None] + np.arange(seq)
        real = np.arange(seq)[None, :] < chunk_lens[:, None]
        block_indices = slot_blocks = slot_offsets = None
        if not (context_lens % bs).any():
            # A chunk's j-th block is its row's block ctx / bs + j; beyond the chunk, scratch.
            first = context_lens[:, None] // bs + np.arange(seq // bs)
            used = np.arange(seq // bs)[None, :] * bs < chunk_lens[:, None]
            dest = np.where(used, np.take_along_axis(tables, first, axis=1), self.scratch_block)
            block_indices = paddle.to_tensor(dest.reshape(-1))
        else:
            token_blocks = np.take_along_axis(tables, positions // bs, axis=1)
            blocks_of = np.where(real, token_blocks, self.scratch_block)
            offsets = np.where(real, positions % bs, np.arange(seq) % bs)
            slot_blocks = paddle.to_tensor(blocks_of.reshape(-1))
            slot_offsets = paddle.to_tensor(offsets.reshape(-1))
        positions = np.where(real, positions, 0)
        # Warmup compiles the with-context path for every shape that has room for context.
        has_context = bool(ctx.any()) if chunks else blocks * bs > seq
        block_list = mask = None
        if has_context:
            # Key j is the j-th token of the sequence: visible to query i iff j <= ctx + i.
            visible = np.arange(blocks * bs)[None, None, :] <= (
                context_lens[:, None, None] + np.arange(seq)[None, :, None]
            )
            block_list = paddle.to_tensor(tables[:, :blocks])
            mask = paddle.to_tensor(np.where(visible, 0.0, _NEG).astype(np.float32)[:, None])
        return EncoderMeta(
            batch=len(chunks),
            shape=(rows, seq, blocks),
            request_ids=[c.request.id for c in chunks],
            input_ids=input_ids,
            positions=positions,
            context_lens=context_lens,
            chunk_lens=chunk_lens,
            block_indices=block_indices,
            slot_blocks=slot_blocks,
            slot_offsets=slot_offsets,
            has_context=has_context,
            block_list=block_list,
            mask=mask,
        )

    def _span_start(self, row_blocks: np.ndarray) -> int | None:
        """Where the decode span starts, or None to list blocks row by row: the span runs
        from the lowest to the highest of the rows' blocks, padded to its bucket, and is
        taken while that bucket is at most decode_span times the row-by-row one."""
        if not self.decode_span or not row_blocks.size:
            return None
        low, high = int(row_blocks.min()), int(row_blocks.max()) + 1
        width, prepared = self.buckets.fit("decode_blocks", high - low)
        listed, _ = self.buckets.fit("decode_blocks", row_blocks.size)
        pool_end = self.scratch_block + 1  # the padded span stays inside the pool + scratch
        if not prepared or width > self.decode_span * listed or width > pool_end:
            return None
        return min(low, pool_end - width)

    def _decoder(
        self, requests: list[Request], shape: tuple[int, int] | None = None
    ) -> DecoderMeta:
        bs = self.block_size
        n = len(requests)
        seq_lens_real = np.array([r.num_computed + 1 for r in requests], dtype=np.int64)
        counts = -(-seq_lens_real // bs)
        used = int(counts.sum())
        # Every row's blocks, one row after another.
        row_blocks = np.array(
            [b for r, c in zip(requests, counts, strict=True) for b in r.block_table[:c]],
            dtype=np.int64,
        )
        start = None if shape else self._span_start(row_blocks)
        if shape is None:
            needed = used if start is None else int(row_blocks.max()) + 1 - int(row_blocks.min())
            shape = self.buckets.shape("decode", batch=n, blocks=needed)
        rows, blocks = shape
        seq_lens = np.zeros(rows, dtype=np.int64)
        seq_lens[:n] = seq_lens_real
        input_ids = np.full(rows, self.pad_id, dtype=np.int64)
        input_ids[:n] = [r.all_ids[r.num_computed] for r in requests]
        positions = np.maximum(seq_lens - 1, 0)
        owner = np.repeat(np.arange(n), counts)
        # Where each row block sits in the list: listed row by row, or at its place in the
        # span, whose other blocks (free, or another request's) stay masked padding.
        if start is None:
            slots = np.arange(used)
            block_list = np.full(blocks, self.scratch_block, dtype=np.int64)
            block_list[:used] = row_blocks
        else:
            slots = row_blocks - start
            block_list = np.arange(start, start + blocks, dtype=np.int64)
        block_groups = np.full(blocks, rows - 1, dtype=np.int64)  # padding: the last row
        block_groups[slots] = owner
        mapping = np.zeros((blocks, rows), dtype=np.float32)
        mapping[slots, owner] = 1.0
        # Slots of a row's j-th block that hold tokens: seq_len - j * bs of them, at most bs.
        index_in_row = np.arange(used) - np.repeat(np.cumsum(counts) - counts, counts)
        filled = np.zeros(blocks, dtype=np.int64)
        filled[slots] = seq_lens_real[owner] - index_in_row * bs
        bias = np.where(np.arange(bs)[None, :] < filled[:, None], 0.0, _NEG).astype(np.float32)
        row_width = max(1, int(counts.max(initial=0)))
        row_slots = np.full(blocks, rows * row_width, dtype=np.int64)
        row_slots[slots] = owner * row_width + index_in_row
        # Each row writes its new token into the last of its blocks.
        write_blocks = np.full(rows, self.scratch_block, dtype=np.int64)
        write_blocks[:n] = row_blocks[np.cumsum(counts) - 1]
        offsets = np.where(np.arange(rows) < n, positions % bs, 0)
        return DecoderMeta(
            batch=n,
            shape=(rows, blocks),
            request_ids=[r.id for r in requests],
            input_ids=input_ids,
            positions=positions,
            seq_lens=seq_lens,
            block_indices=paddle.to_tensor(write_blocks),
            block_offsets=paddle.to_tensor(offsets),
            block_list=paddle.to_tensor(block_list),
            block_groups=paddle.to_tensor(block_groups),
            block_mapping=paddle.to_tensor(mapping),
            block_bias=paddle.to_tensor(bias),
            row_slots=paddle.to_tensor(row_slots),
            row_width=row_width,
            block_range=None if start is None else (start, start + blocks),
        )

    def build(self, plan: StepPlan) -> ForwardMeta:
        encoder = self._encoder(plan.prefill) if plan.prefill else None
        decoder = self._decoder(plan.decode) if plan.decode else None
        return self._assemble(plan.mode, encoder, decoder, plan.num_tokens)

    def dummy(
        self, prefill: tuple[int, int, int] | None, decode: tuple[int, int] | None
    ) -> ForwardMeta:
        """A step of the given bucket shapes made only of padding: what warmup runs."""
        encoder = self._encoder([], prefill) if prefill else None
        decoder = self._decoder([], decode) if decode else None
        mode = "mixed" if prefill and decode else "extend" if prefill else "decode"
        return self._assemble(mode, encoder, decoder, 0)

    def warmup_shapes(self, mixed: bool) -> dict[str, list[tuple]]:
        """Every prepared prefill and decode shape; with chunking, a coarse mixed grid too
        (one prefill row, the widest block tables), as the reference warms it."""
        sizes = self.buckets.sizes
        budget = self.max_tokens
        prefill = [
            (b, s, m)
            for b in sizes["prefill_batch"]
            for s in sizes["prefill_seq"]
            for m in sizes["prefill_blocks"]
            if b * s <= budget and m * self.block_size >= s
        ]
        decode = [(b, m) for b in sizes["decode_batch"] for m in sizes["decode_blocks"]]
        shapes: dict[str, list[tuple]] = {
            "prefill": [(p, None) for p in prefill],
            "decode": [(None, d) for d in decode],
        }
        if mixed:
            widest_p, widest_d = int(sizes["prefill_blocks"][-1]), int(sizes["decode_blocks"][-1])
            shapes["mixed"] = [
                ((1, int(s), widest_p), (int(b), widest_d))
                for s in sizes["prefill_seq"]
                for b in sizes["decode_batch"]
                if s + b <= budget
            ]
        return {
            phase: [
                tuple(None if x is None else tuple(int(v) for v in x) for x in pair)
                for pair in pairs
            ]
            for phase, pairs in shapes.items()
        }

    def _assemble(
        self,
        mode: str,
        encoder: EncoderMeta | None,
        decoder: DecoderMeta | None,
        num_tokens: int,
    ) -> ForwardMeta:
        ids, positions, rows, bucket = [], [], [], []
        offset = 0
        if encoder:
            b, s, m = encoder.shape
            ids.append(encoder.input_ids.reshape(-1))
            positions.append(encoder.positions.reshape(-1))
            rows.append(np.arange(encoder.batch) * s + encoder.chunk_lens[: encoder.batch] - 1)
            bucket.append(f"prefill {b}x{s}x{m}")
            offset = b * s
        if decoder:
            ids.append(decoder.input_ids)
            positions.append(decoder.positions)
            rows.append(offset + np.arange(decoder.batch))
            bucket.append(f"decode {decoder.shape[0]}x{decoder.shape[1]}")
        input_ids = np.concatenate(ids)
        logits_rows = np.concatenate(rows).astype(np.int64)
        if not logits_rows.size:
            logits_rows = np.zeros(1, dtype=np.int64)  # warmup: one row keeps the shapes valid
        return ForwardMeta(
            mode=mode,
            encoder=encoder,
            decoder=decoder,
            input_ids=paddle.to_tensor(input_ids),
            positions=paddle.to_tensor(np.concatenate(positions)),
            logits_rows=paddle.to_tensor(logits_rows),
            num_tokens=num_tokens,
            padded_tokens=len(input_ids),
            bucket=" + ".join(bucket),
        )
