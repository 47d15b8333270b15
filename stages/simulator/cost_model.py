"""The cost of one step on a simulated device: a roofline per term, scaled by coefficients.

Each term is max(FLOPs / achieved FLOP rate, bytes / achieved bandwidth) times its
coefficient; a step is the sum of its terms, plus the per-step overhead (a coefficient in
seconds), plus the recompile penalty when its bucket was not warmed. `fit` finds the
coefficients from measured steps by non-negative least squares on the terms' rooflines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stages.model_spec import ModelSpec
from stages.simulator.hardware import HardwareProfile, write_profile
from stages.simulator.nnls import nnls
from stages.step_shape import StepShape

TERMS = (
    "linear",
    "prefill_attention",
    "decode_attention",
    "kv_write",
    "lm_head",
    "allreduce",
    "kv_blocks",
)
OVERHEAD = "overhead"
# The cost of handling one KV block in one layer (its index, gather and mask rows) beyond
# its bytes, before its coefficient; it tells small blocks from large ones. A device's
# profile sets its coefficient by calibration; uncalibrated it is 0 (the bytes alone).
BLOCK_S = 1e-6
UNCALIBRATED = {"kv_blocks": 0.0}
RECOMPILE = "recompile"


@dataclass(frozen=True)
class StepWork:
    """What a step computes, in tokens, whatever the device's padding rule."""

    linear_tokens: float = 0.0  # rows through the GEMMs, prefill and decode concatenated
    prefill_pairs: float = 0.0  # query-key pairs of prefill attention
    prefill_keys: float = 0.0  # KV slots prefill attention reads
    decode_slots: float = 0.0  # KV slots decode attention reads (one query each)
    kv_writes: float = 0.0  # KV slots written
    sampled_rows: float = 0.0  # rows through the lm head
    blocks: float = 0.0  # KV blocks attention gathers, prefill rows' and decode's

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
    if shape.decode is not None and shape.decode[0] and not shape.decode_lens:
        raise ValueError("the device computes real tokens: give StepShape.decode_lens")
    chunks = shape.chunk_lens
    contexts = shape.context_lens or (0,) * len(chunks)
    # Query i of a chunk (1-based) sees the context and i of its own chunk's tokens.
    pairs = sum(c * ctx + c * (c + 1) / 2 for c, ctx in zip(chunks, contexts, strict=True))
    keys = sum(chunks) + sum(contexts)
    bs = shape.block_size
    blocks = sum(-(-(c + ctx) // bs) for c, ctx in zip(chunks, contexts, strict=True))
    prefill = StepWork(sum(chunks), pairs, keys, 0, sum(chunks), len(chunks), blocks)
    rows, lens = len(shape.decode_lens), shape.decode_lens
    decode_blocks = sum(-(-n // bs) for n in lens)
    return prefill + StepWork(rows, 0, 0, sum(lens), rows, rows, decode_blocks)


class CostModel:
    """Seconds per step of `spec` on `hardware` at tensor parallelism `tp`."""

    def __init__(
        self,
        spec: ModelSpec,
        hardware: HardwareProfile,
        tp: int = 1,
        coefficients: Mapping[str, float] | None = None,
    ) -> None:
        spec.check_tp(tp)
        self.spec, self.hardware, self.tp = spec, hardware, tp
        merged = {term: 1.0 for term in TERMS} | UNCALIBRATED | {OVERHEAD: hardware.step_overhead_s}
        for given in (hardware.coefficients, coefficients or {}):
            unknown = sorted(set(given) - set(merged))
            if unknown:
                raise ValueError(
                    f"unknown cost coefficients {', '.join(unknown)}: the terms are "
                    f"{', '.join((*TERMS, OVERHEAD))}"
                )
            merged |= {k: float(v) for k, v in given.items()}
        if any(v < 0 for v in merged.values()):
            raise ValueError(f"cost coefficients must be >= 0: {merged}")
        self.coefficients: dict[str, float] = merged

    def with_coefficients(self, coefficients: Mapping[str, float]) -> CostModel:
        return CostModel(self.spec, self.hardware, self.tp, {**self.coefficients, **coefficients})

    def work(self, shape: StepShape) -> StepWork:
        return padded_work(shape) if self.hardware.pads_to_buckets else real_work(shape)

    def rooflines(self, shape: StepShape) -> dict[str, float]:
        """Each term's roofline time in seconds, before its coefficient."""
        spec, hw, tp, w = self.spec, self.hardware, self.tp, self.work(shape)
        gemm, attn = hw.gemm_flops_per_s, hw.attention_flops_per_s
        mem, link = hw.memory_bytes_per_s, hw.interconnect_bytes_per_s
        return {
            "linear": max(
                spec.linear_flops(w.linear_tokens, tp) / gemm,
                spec.linear_bytes(w.linear_tokens, tp) / mem,
            ),
            "prefill_attention": max(
                spec.attention_flops(w.prefill_pairs, tp) / attn,
                spec.kv_bytes(w.prefill_keys, tp) / mem,
            ),
            "decode_attention": max(
                spec.attention_flops(w.decode_slots, tp) / attn,
                spec.kv_bytes(w.decode_slots, tp) / mem,
            ),
            "kv_write": spec.kv_bytes(w.kv_writes, tp) / mem,
            "lm_head": max(
                spec.lm_head_flops(w.sampled_rows, tp) / gemm,
                spec.lm_head_bytes(w.sampled_rows, tp) / mem,
            ),
            "allreduce": spec.allreduce_bytes(w.linear_tokens, tp) / link,
            "kv_blocks": w.blocks * spec.num_layers * BLOCK_S,
        }

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds of each term, the overhead and the recompile penalty; they sum to the step."""
        c = self.coefficients
        parts = {term: c[term] * t for term, t in self.rooflines(shape).items()}
        parts[OVERHEAD] = c[OVERHEAD]
        parts[RECOMPILE] = self.hardware.recompile_s if shape.miss else 0.0
        return parts

    def step_time(self, shape: StepShape) -> float:
        return sum(self.breakdown(shape).values())

    def warmup_time(self, num_shapes: int) -> float:
        """Compiling every prepared bucket once before serving."""
        if num_shapes < 0:
            raise ValueError(f"warmup_time: num_shapes={num_shapes} must be >= 0")
        return num_shapes * self.hardware.compile_s

    def fit(
        self,
        samples: Sequence[tuple[StepShape, float]],
        terms: Sequence[str] | None = None,
        relative: bool = False,
    ) -> dict[str, float]:
        """Coefficients that best explain measured (shape, seconds) steps, all >= 0.

        Only `terms` (default: every term and the overhead) are fitted; the others keep their
        coefficients, as does a term no sample exercises (an all-zero column, e.g. the
        all-reduce at tp=1). A miss's recompile penalty is taken off its time first.
        `relative` weighs each sample by 1 / its time, so that small steps count as much
        as large ones (the squared relative error is minimised).
        """
        names = (*TERMS, OVERHEAD)
        chosen = names if terms is None else tuple(terms)
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise ValueError(f"fit: unknown terms {', '.join(unknown)}; the terms are {names}")
        a, b = self._design(samples)
        if relative:
            weight = 1.0 / np.maximum(b, 1e-12)
            a, b = a * weight[:, None], b * weight
        fixed = [j for j, name in enumerate(names) if name not in chosen]
        b = b - a[:, fixed] @ np.array([self.coefficients[names[j]] for j in fixed])
        used = [j for j in range(len(names)) if names[j] in chosen and a[:, j].any()]
        if not used:
            raise ValueError(f"fit: no sample exercises any of {', '.join(chosen)}")
        if len(samples) < len(used):
            raise ValueError(
                f"fit: {len(samples)} samples for {len(used)} coefficients; give at least "
                f"{len(used)} steps of varied shapes"
            )
        scale = np.linalg.norm(a[:, used], axis=0)  # unit columns: rooflines span decades
        _check_separable(a[:, used] / scale, [names[j] for j in used])
        solution = nnls(a[:, used] / scale, b) / scale
        fitted = dict(self.coefficients)
        fitted.update({names[j]: float(x) for j, x in zip(used, solution, strict=True)})
        return fitted

    def _design(self, samples: Sequence[tuple[StepShape, float]]) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's roofline per term (and 1 s for the overhead), and its time less any
        recompile penalty."""
        rows, times = [], []
        for shape, seconds in samples:
            if not np.isfinite(seconds) or seconds < 0:
                raise ValueError(f"fit: a measured step time of {seconds} s is not >= 0")
            roof = self.rooflines(shape)
            rows.append([roof[t] for t in TERMS] + [1.0])
            times.append(seconds - (self.hardware.recompile_s if shape.miss else 0.0))
        return np.array(rows, dtype=float).reshape(-1, len(TERMS) + 1), np.array(times)

    def write_profile(self, path: str | Path, coefficients: Mapping[str, float]) -> Path:
        """The hardware profile with `coefficients` (e.g. from `fit`) for `hardware=measured`."""
        return write_profile(path, self.hardware, coefficients)


def _check_separable(a: np.ndarray, names: Sequence[str]) -> None:
    """Refuses samples in which some terms' times move together: their coefficients could
    trade against each other freely (e.g. KV writes and all-reduces both scale with tokens)."""
    _, singular, vt = np.linalg.svd(a, full_matrices=False)
    null = vt[singular < 1e-9 * singular[0]]
    if len(null):
        tied = [
            n for n, weight in zip(names, np.abs(null).max(axis=0), strict=True) if weight > 1e-6
        ]
        raise ValueError(
            f"fit: these samples cannot tell {', '.join(tied)} apart (their times move "
            "together): fit fewer of them (terms=...) or add steps of other shapes"
        )
