"""The metadata builder: a step plan laid out in the static, padded shapes an HPU executes
(the value types it fills: stages/forward/forward_meta.py; the bucket axes from the config:
stages/forward/bucket_axes.py; the prefill part's tensors: stages/forward/prefill_part.py).

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

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.forward import engine_grids
from stages.forward.bucket_axes import AXES, fastdeploy_axes, resolve_axes
from stages.forward.buckets import Axis, Bucketing, Buckets, warmup_counts, warmup_graphs
from stages.forward.cudagraph import CaptureRule, cudagraph_axes, cudagraph_warmup
from stages.forward.decode_part import DecodePartBuilder
from stages.forward.forward_meta import (
    DecodeMeta,
    ForwardMeta,
    PrefillMeta,
    decode_lens,
    step_shape,
)
from stages.forward.host_tensor import host_tensor
from stages.forward.prefill_part import PrefillPartBuilder
from stages.forward.step_shape import StepShape, decode_totals
from stages.scheduling.kv_cache import KVCacheManager, blocks_for
from stages.scheduling.request import (
    DecodeRun,
    PrefillChunk,
    PromptSpan,
    StepMode,
    StepPlan,
)

if TYPE_CHECKING:
    pass


class BucketedMetadataBuilder:
    """Builds each step's metadata padded to its buckets, and the warmup shapes."""

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
        fastdeploy: Mapping[str, int],
        capture: CaptureRule | str,
        capture_max_batch: int,
        step_recipes: bool,
        pad_id: int = 0,
        packed: bool = False,
    ) -> None:
        """packed: only a step's real tokens laid out (an attention stage's `packs_rows`).
        fastdeploy: FastDeploy's warmup steps (engine_grids.FastDeploySteps' fields), read when
        bucketing=fastdeploy: the sizes and warmup grid are then FastDeploy's own.
        capture, capture_max_batch: whose CUDA-graph sizes bucketing=cudagraph captures;
        step_recipes: mixed steps compile as engine_grids.step_graphs(whole=True) says."""
        bs = kv_cache.block_size
        given = dict(zip(AXES, (prefill_batch, prefill_seq, prefill_blocks, decode_batch,
                                decode_blocks), strict=True))  # fmt: skip
        axes = resolve_axes(given, bs, max_tokens, max_num_seqs, max_model_len,
                            kv_cache.num_blocks, kv_cache.prefix is not None)  # fmt: skip
        for key, value in (("max_warmup_shapes", max_warmup_shapes), ("decode_span", decode_span)):
            if value < 0:
                raise ValueError(f"metadata.{key}={value}: needs 0 (no limit, off) or more")
        self.max_warmup_shapes = max_warmup_shapes
        self.kv_cache = kv_cache
        self.block_size = bs
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self.decode_span = decode_span
        self.packed = packed
        self.fastdeploy: engine_grids.FastDeploySetup | None = None
        self.capture = CaptureRule(capture), capture_max_batch
        self.step_recipes = step_recipes
        axes = self._engine_axes(
            Bucketing(bucketing), axes, fastdeploy, max_num_seqs, max_model_len
        )
        self.buckets = Buckets(bucketing, axes)
        self.prefill_part = PrefillPartBuilder(kv_cache, pad_id)
        self.decode_part = DecodePartBuilder(kv_cache, self.buckets, pad_id, self.decode_span)

    def _engine_axes(
        self,
        strategy: Bucketing,
        axes: dict[str, Axis],
        fastdeploy: Mapping[str, int],
        max_num_seqs: int,
        model_len: int,
    ) -> dict[str, Axis]:
        """The axes as an engine's own strategy sizes them (FastDeploy's, a GPU's capture
        sizes); the resolved axes for the others."""
        if strategy is Bucketing.fastdeploy:
            return self._fastdeploy_axes(axes, fastdeploy, max_num_seqs, model_len)
        if strategy is Bucketing.cudagraph:
            return cudagraph_axes(axes, max_num_seqs, *self.capture)
        return axes

    def _fastdeploy_axes(
        self, axes: dict[str, Axis], given: Mapping[str, int], max_num_seqs: int, model_len: int
    ) -> dict[str, Axis]:
        """FastDeploy's own sizes for each axis (its steps kept for its warmup grid)."""
        kv = self.kv_cache
        limits = engine_grids.ServerLimits(
            kv.block_size, self.max_tokens, max_num_seqs, model_len, kv.num_blocks,
            kv.prefix is not None, False,
        )  # fmt: skip
        steps, axes = fastdeploy_axes(axes, given, limits)
        self.fastdeploy = steps, limits
        return axes

    @property
    def bucket_misses(self) -> int:
        return self.buckets.misses

    @property
    def scratch(self) -> int:
        return self.kv_cache.scratch_block

    # -- the step ----------------------------------------------------------------------------
    def build(self, plan: StepPlan) -> ForwardMeta:
        needed: dict[str, list[int]] = {}
        prefill_shape = self._prefill_shape(plan.prefill, needed)
        prefill = self.prefill_part.build(plan.prefill, prefill_shape, self.packed)
        lens = decode_lens(plan)  # the scheduler's array where it has one; read once
        decode = None
        if plan.decode:
            decode = self.decode_part.build(plan.decode, lens, needed=needed, packed=self.packed)
        shape = step_shape(
            self.block_size,
            plan,
            prefill.shape if prefill else None,
            decode.shape if decode else None,
            lens,
        )
        asked = [(i, c, span) for i, c in enumerate(plan.prefill) if (span := c.prompt_span())]
        meta = self._assemble(
            plan.mode, prefill, decode, plan.num_tokens, shape, self.packed, asked
        )
        meta.needed = needed
        return meta

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
        rows, widths = rows[:steps], widths[:steps]  # (of arrays made here: written in place)
        rows[0], widths[0] = head.shape.decode or (0, 0)
        return run.padded(rows, widths, head)

    def dummy(
        self, prefill: tuple[int, int, int] | None, decode: tuple[int, int] | None
    ) -> ForwardMeta:
        """A step of the given bucket shapes made only of padding: what warmup runs."""
        prefill_meta = self.prefill_part.build([], prefill) if prefill else None
        decode_meta = (
            self.decode_part.build([], np.zeros(0, dtype=np.int64), decode) if decode else None
        )
        mode = StepMode.of(bool(prefill), bool(decode))
        shape = StepShape(self.block_size, prefill, decode)
        return self._assemble(mode, prefill_meta, decode_meta, 0, shape)

    # -- the prefill bucket ------------------------------------------------------------------
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

    # -- warmup ------------------------------------------------------------------------------
    def warmup_counts(self, mixed: bool, padded_budget: bool = True) -> dict[str, int]:
        """The graphs each phase of warmup_shapes compiles, counted without listing them
        (FastDeploy's grid is listed: its loops are the count; so is any grid whose mixed
        steps compile whole)."""
        if self.fastdeploy or self.step_recipes:
            shapes = self.warmup_shapes(mixed, padded_budget)
            return engine_grids.part_graphs(shapes, self.step_recipes)
        if self.buckets.strategy is Bucketing.cudagraph:
            return {phase: len(s) for phase, s in cudagraph_warmup(self._sizes()).items()}
        return warmup_counts(self._sizes(), self.block_size, self.max_tokens, mixed, padded_budget)

    def warmup_shapes(self, mixed: bool, padded_budget: bool = True) -> dict[str, list[tuple]]:
        """Every prefill and decode bucket some step can pad to (padded_budget: the
        scheduler's budget bounds rows x padded width); with chunking, a coarse mixed grid
        too (one prefill row, the widest block tables), as FastDeploy warms it. With
        bucketing=fastdeploy: FastDeploy's own warmup runs; under the GPU model (cudagraph):
        one profiling prefill and the decode capture sizes."""
        if self.fastdeploy:
            steps, limits = self.fastdeploy
            return engine_grids.fastdeploy_warmup(steps, replace(limits, chunked_prefill=mixed))
        if self.buckets.strategy is Bucketing.cudagraph:
            return cudagraph_warmup(self._sizes())
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
        asked: list[tuple[int, PrefillChunk, PromptSpan]] | None = None,
    ) -> ForwardMeta:
        """asked: the prefill chunks (by index) whose prompt positions' logits are asked
        for; their rows follow the sampled ones."""
        ids, positions, rows = [], [], []
        offset = padded = 0
        if prefill:
            b, s, _ = prefill.shape
            ids.append(prefill.input_ids.reshape(-1))
            positions.append(prefill.positions.reshape(-1))
            lens = prefill.chunk_lens[: prefill.batch]
            rows.append(np.cumsum(lens) - 1 if packed else np.arange(prefill.batch) * s + lens - 1)
            offset = prefill.num_tokens if packed else b * s
            padded = self.buckets.padded_prefill_tokens(prefill.shape, prefill.num_tokens)
        if decode:
            padded += decode.shape[0]
            ids.append(decode.input_ids)
            positions.append(decode.positions)
            rows.append(offset + np.arange(decode.batch))
        if asked and prefill:
            rows.append(self._prompt_rows(asked, prefill, packed))
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
            prompt_spans=[span for _, _, span in asked or ()],
        )

    @staticmethod
    def _prompt_rows(
        asked: list[tuple[int, PrefillChunk, PromptSpan]], prefill: PrefillMeta, packed: bool
    ) -> np.ndarray:
        """The rows holding each asked span's positions, chunk by chunk."""
        lens = prefill.chunk_lens[: prefill.batch]
        firsts = np.cumsum(lens) - lens if packed else np.arange(prefill.batch) * prefill.shape[1]
        return np.concatenate(
            [
                firsts[i] + np.arange(span.start - chunk.start, span.end - chunk.start)
                for i, chunk, span in asked
            ]
        )


class ShapeMetadataBuilder(BucketedMetadataBuilder):
    """A simulated device's builder: each step's buckets and lengths, no tensors, with the
    decode blocks listed row by row as the HPU's fused op takes them (no decode span)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "decode_span": 0.0})

    def build(self, plan: StepPlan) -> ForwardMeta:
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
        shape = step_shape(self.block_size, plan, prefill, decode, lens, kv)
        prompt_tokens = sum(shape.chunk_lens)
        tokens = rows + prompt_tokens  # plan.num_tokens, from what is at hand
        padded = self.buckets.padded_prefill_tokens(prefill, prompt_tokens) if prefill else 0
        padded += decode[0] if decode else 0
        return ForwardMeta.of_shapes(plan.mode, tokens, padded, shape, needed)
