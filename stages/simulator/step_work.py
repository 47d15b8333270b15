"""What a step computes (its work, in tokens) and moves (its amounts, in FLOPs and bytes on
one device), whatever the device's speed: the quantities the cost model prices, and what
calibration records and re-times for other hardware figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.arithmetic import ceil_div
from stages.forward.step_shape import StepShape, decode_totals

# A Llama-style layer runs four GEMMs: fused QKV, the output projection, fused gate-up and
# down (the MLP's two). Each pays the device's fixed GEMM time once.
GEMMS_PER_LAYER = 4
MLP_GEMMS = 2


# StepWork and StepAmounts are values nothing changes once made; not frozen, as a simulated
# device makes one of each a step and a frozen dataclass's __init__ costs several times a
# plain one's.
@dataclass(slots=True)
class StepWork:
    """What a step computes, in tokens, whatever the device's padding rule. Each field is a
    number, or an array of many steps' numbers (many steps' at once)."""

    linear_tokens: Any = 0.0  # rows through the GEMMs, prefill and decode concatenated
    prefill_pairs: Any = 0.0  # query-key pairs of prefill attention
    prefill_keys: Any = 0.0  # KV slots prefill attention reads
    decode_slots: Any = 0.0  # KV slots decode attention reads (one query each)
    kv_writes: Any = 0.0  # KV slots written
    sampled_rows: Any = 0.0  # rows through the lm head
    blocks: Any = 0.0  # KV blocks attention gathers, prefill rows' and decode's

    def __add__(self, other: StepWork) -> StepWork:
        return StepWork(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def _values(self) -> tuple[float, ...]:
        return (
            self.linear_tokens,
            self.prefill_pairs,
            self.prefill_keys,
            self.decode_slots,
            self.kv_writes,
            self.sampled_rows,
            self.blocks,
        )


def padded_work(shape: StepShape) -> StepWork:
    """The HPU's work: the padded buckets, every padding row and block included."""
    work = StepWork()
    if shape.prefill is not None:
        rows, seq, blocks = shape.prefill
        keys = blocks * shape.block_size
        work += StepWork(
            rows * seq, rows * seq * keys, rows * keys, 0, rows * seq, rows, rows * blocks
        )
    if shape.decode is not None:
        rows, blocks = shape.decode
        work += StepWork(rows, 0, 0, blocks * shape.block_size, rows, rows, blocks)
    return work


def real_work(shape: StepShape) -> StepWork:
    """A GPU's work: the real tokens, causal prefill attention over each row's context."""
    if shape.prefill is not None and shape.prefill[0] and not shape.chunk_lens:
        raise ValueError("the device computes real tokens: give StepShape.chunk_lens")
    rows, slots, decode_blocks = decode_sums(shape)
    chunks, bs = shape.chunk_lens, shape.block_size
    if not chunks:  # a decode-only step (most steps): nothing to add
        return StepWork(rows, 0, 0, slots, rows, rows, decode_blocks)
    tokens, pairs, keys, blocks = 0, 0.0, 0, 0
    for chunk, context in zip(chunks, shape.context_lens or (0,) * len(chunks), strict=True):
        tokens += chunk
        # Query i of a chunk (1-based) sees the context and i of its own chunk's tokens.
        pairs += chunk * context + chunk * (chunk + 1) / 2
        keys += chunk + context
        blocks += ceil_div(chunk + context, bs)
    tokens += rows
    sampled = len(chunks) + rows
    return StepWork(tokens, pairs, keys, slots, tokens, sampled, blocks + decode_blocks)


def decode_sums(shape: StepShape) -> tuple[int, int, int]:
    """The decode rows of a step on a device that computes real tokens, the KV slots they
    read and the blocks they fill: sum(ceil(len / block_size))."""
    lens, known = shape.decode_lens, shape.decode_kv
    if known is not None:
        return len(lens), *known
    if shape.decode is not None and shape.decode[0] and not len(lens):
        raise ValueError("the device computes real tokens: give StepShape.decode_lens")
    return len(lens), *decode_totals(lens, shape.block_size)


@dataclass(slots=True)
class StepAmounts:
    """What a step computes and moves on one device, whatever the device's speed: FLOPs and
    bytes per term, precision and tensor parallelism applied. Each field is a number, or an
    array of many steps' numbers (what a fit over many runs evaluates at once)."""

    linear_flops: Any
    linear_bytes: Any  # the GEMMs' weights, read once
    gemms: Any  # GEMM kernels launched (0 in a step without tokens)
    prefill_attention_flops: Any
    prefill_kv_bytes: Any
    decode_attention_flops: Any
    decode_kv_bytes: Any
    kv_write_bytes: Any
    lm_head_flops: Any
    lm_head_bytes: Any
    allreduce_bytes: Any  # sent by each device over its link
    allreduce_calls: Any
    kv_blocks_s: Any  # the blocks' fixed handling time, before its coefficient
    # Parts the step's batch is split into so that all-reduces overlap compute (1: none).
    batch_split: Any = 1
    # Expert parallelism's all-to-all dispatches and combines (stages.simulator.expert_parallel).
    alltoall_bytes: Any = 0.0  # sent by each device over its links to the ep - 1 others
    alltoall_calls: Any = 0
    # The grouped GEMMs of the MoE layers (stages.simulator.moe_layer): layers run, and
    # experts run summed over them.
    moe_layers: Any = 0
    moe_experts: Any = 0.0

    @staticmethod
    def stack(steps: Sequence[StepAmounts]) -> StepAmounts:
        """Many steps' amounts as one of arrays."""
        names = [f.name for f in dataclasses.fields(StepAmounts)]
        return StepAmounts(
            **{n: np.array([getattr(a, n) for a in steps], dtype=float) for n in names}
        )
