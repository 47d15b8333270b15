"""The cost of one step on a simulated device: a roofline per term, scaled by coefficients.

Each term is max(FLOPs / achieved FLOP rate, bytes / achieved bandwidth) times its
coefficient; a step is the sum of its terms, plus the per-step overhead (a coefficient in
seconds), plus the recompile penalty when its bucket was not warmed. `fit` finds the
coefficients from measured steps by non-negative least squares on the terms' rooflines.

Precision (stages.simulator.precision) sets the bytes of weights and KV slots and whether
the GEMMs run at the FP8 rate. Tensor parallelism costs what hardware makes it cost: each
of a layer's two all-reduces pays the link's per-call latency besides its bytes, and a GEMM
of F FLOPs takes F / rate + `gemm_fill_s` (launch, pipeline fill, the last partial wave), so
its efficiency F / (F + rate x fill) falls as tensor parallelism makes the matrices thin.
A prefill whose batch is split into k parts (Optimum Habana's `--attn_batch_split`) sends
one part's all-reduce while the next part computes: all but 1 / k of the shorter of the
two is hidden.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from stages.forward.step_shape import StepShape
from stages.model.spec import ModelSpec
from stages.simulator.cost_fit import fit_coefficients
from stages.simulator.expert_parallel import PLAIN, ExpertParallel, check_layout, token_amounts
from stages.simulator.hardware import HardwareProfile, write_profile
from stages.simulator.precision import BF16, Precision
from stages.simulator.step_work import (
    GEMMS_PER_LAYER,
    StepAmounts,
    StepWork,
    decode_sums,
    padded_work,
    real_work,
)
from stages.simulator.terms import (
    ALLREDUCES_PER_LAYER,
    BLOCK_S,
    OVERHEAD,
    RECOMPILE,
    TERMS,
    UNCALIBRATED,
    term_seconds,
)

# KV slots and blocks of a decode step far beyond any real one, where decode_rates checks
# that a step's time is still affine in them.
AFFINE_PROBE = (1 << 24, 1 << 20)
# Row counts the table of decode rates grows by (each costs a few step evaluations).
RATE_ROWS = 32


class SeparableRates(NamedTuple):
    """Seconds of one unit of the parts of a step that each set one term alone."""

    per_pair: float  # a query-key pair of prefill attention, bound by its FLOPs
    per_key: float  # a key prefill attention reads, bound by its bytes
    per_slot: float  # a KV slot decode attention reads
    per_block: float  # a KV block gathered
    overhead: float


class CostModel:
    """Seconds per step of `spec` on `hardware` at tensor parallelism `tp` and `precision`."""

    def __init__(
        self,
        spec: ModelSpec,
        hardware: HardwareProfile,
        tp: int = 1,
        coefficients: Mapping[str, float] | None = None,
        precision: Precision = BF16,
        prefill_batch_split: int = 1,
        parallel: ExpertParallel = PLAIN,
    ) -> None:
        spec.check_tp(tp)
        check_layout(spec, tp, parallel)
        self.parallel = parallel
        if isinstance(prefill_batch_split, bool) or not 1 <= prefill_batch_split <= 64:
            raise ValueError(
                f"executor.prefill_batch_split={prefill_batch_split} must be an integer "
                "from 1 (no split) to 64"
            )
        self.spec, self.hardware, self.tp, self.precision = spec, hardware, tp, precision
        self.prefill_batch_split = int(prefill_batch_split)
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
        lockstep = parallel.lockstep if spec.moe is not None else 1.0  # MoE dp replicas wait
        self._timing = {term: c * lockstep for term, c in merged.items()}  # what a step takes
        dtype = spec.dtype_bytes
        # Bytes of a quantised weight and of a KV value, relative to the spec's dtype.
        self._weight_scale = precision.weight_bytes(dtype) / dtype
        self._kv_scale = precision.kv_bytes(dtype) / dtype
        self._kv_slot = spec.kv_bytes_per_token(tp) * self._kv_scale  # bytes of one KV slot
        self._by_tokens: dict[float, dict[str, Any]] = {}  # see _token_amounts
        self._by_sampled: dict[float, dict[str, Any]] = {}  # see _sampled_amounts
        # _mixed_seconds' parts: the seconds a step's tokens and its sampled rows set, by
        # count, and separable_rates (None until asked)
        self._token_seconds: dict[float, float] = {}
        self._sampled_seconds: dict[float, float] = {}
        self._separable: SeparableRates | None = None
        # decode_rates by row count, and as three arrays by row count (_decode_rate_table)
        self._decode_rates: list[tuple[float, float, float]] = []
        self._rate_table: tuple[np.ndarray, ...] = (np.zeros(0),) * 3

    def with_coefficients(self, coefficients: Mapping[str, float]) -> CostModel:
        merged = {**self.coefficients, **coefficients}
        rest = (self.precision, self.prefill_batch_split, self.parallel)
        return CostModel(self.spec, self.hardware, self.tp, merged, *rest)

    def work(self, shape: StepShape) -> StepWork:
        return padded_work(shape) if self.hardware.pads_to_buckets else real_work(shape)

    def gemm_efficiency(self, flops: float) -> float:
        """Achieved fraction of the GEMM rate for one GEMM of `flops`: the fixed fill time
        weighs on thin GEMMs and vanishes on large ones (1 with no fill time)."""
        busy = flops / self.hardware.gemm_flops_per_s(fp8=self.precision.fp8_gemm)
        total = busy + self.hardware.gemm_fill_s
        return busy / total if total > 0 else 1.0

    def amounts(self, shape: StepShape) -> StepAmounts:
        """The step's FLOPs and bytes on one device, in this model's precision and tp."""
        return self.amounts_of(self.work(shape))

    def decode_seconds(
        self, rows: int | np.ndarray, slots: np.ndarray, blocks: np.ndarray
    ) -> np.ndarray:
        """Seconds of decode-only steps, given their real rows (one count for every step,
        or each step's), each step's KV slots and blocks, on a device that computes real
        tokens: step_time's, many steps at once (a run of steps a simulated device does in
        one go), by each row count's decode rates."""
        try:
            fixed, per_slot, per_block = [column[rows] for column in self._rate_table]
        except IndexError:  # a row count beyond the table
            fixed, per_slot, per_block = [column[rows] for column in self._decode_rate_table(rows)]
        return fixed + per_slot * slots + per_block * blocks

    def least_decode_seconds(self) -> float:
        """The least seconds a decode-only step takes: one row's with no KV slot or block,
        compiles left out (more rows, slots or blocks never take less)."""
        if len(self._decode_rates) < 2:
            self._decode_rate_table(1)
        return self._decode_rates[1][0]

    def _decode_rate_table(self, rows: int | np.ndarray) -> tuple[np.ndarray, ...]:
        """decode_rates of 0, 1, ... rows (at least the most of `rows`) as three arrays by
        row count: made once, in steps of RATE_ROWS row counts as larger ones come."""
        most = int(rows.max()) if isinstance(rows, np.ndarray) else rows
        if len(self._decode_rates) <= most:
            more = range(len(self._decode_rates), (most // RATE_ROWS + 1) * RATE_ROWS)
            self._decode_rates += [self.decode_rates(n) for n in more]
            self._rate_table = tuple(np.array(self._decode_rates).T)
        return self._rate_table

    def decode_rates(self, rows: int) -> tuple[float, float, float]:
        """A decode-only step of `rows` rows on a device that computes real tokens takes
        fixed + per_slot x its KV slots + per_block x its blocks seconds: each term is a
        roofline of amounts proportional to the slots, or to the blocks, or set by the rows
        alone. The three numbers come from the terms themselves (their change from no slot
        or block to one); a step far out checks that the time is still affine in them."""
        seconds = [
            self._weighted_terms(StepWork(rows, 0, 0, slots, rows, rows, blocks))
            for slots, blocks in ((0, 0), (1, 0), (0, 1), AFFINE_PROBE)
        ]
        none, slot, block, far = seconds
        fixed = sum(none.values()) + self._timing[OVERHEAD]
        per_slot = sum(slot[term] - t for term, t in none.items())
        per_block = sum(block[term] - t for term, t in none.items())
        exact = sum(far.values()) + self._timing[OVERHEAD]
        affine = fixed + per_slot * AFFINE_PROBE[0] + per_block * AFFINE_PROBE[1]
        if not math.isclose(affine, exact, rel_tol=1e-9):
            raise RuntimeError(
                f"a decode step of {rows} rows takes {exact} s at {AFFINE_PROBE} KV slots "
                f"and blocks, not the {affine} s its rates give: a term is no longer affine "
                "in them, and decode_seconds needs another form"
            )
        return fixed, per_slot, per_block

    def _weighted_terms(self, work: StepWork) -> dict[str, float]:
        """Each term's seconds for one step's work, times its coefficient."""
        c = self._timing
        return {term: c[term] * t for term, t in self._terms(self.amounts_of(work)).items()}

    def _terms(self, amounts: StepAmounts) -> dict[str, Any]:
        """term_seconds of `amounts` on this model's hardware, precision and layout."""
        return term_seconds(
            amounts, self.hardware, self.precision.fp8_gemm, self.tp, self.parallel.ep
        )

    def amounts_of(self, w: StepWork) -> StepAmounts:
        """FLOPs and bytes of a step's work (fields of arrays: many steps')."""
        spec, tp, kv_slot = self.spec, self.tp, self._kv_slot
        return StepAmounts(
            **self._rows_amounts(w.linear_tokens, w.sampled_rows),
            prefill_attention_flops=spec.attention_flops(w.prefill_pairs, tp),
            prefill_kv_bytes=w.prefill_keys * kv_slot,
            decode_attention_flops=spec.attention_flops(w.decode_slots, tp),
            decode_kv_bytes=w.decode_slots * kv_slot,
            kv_write_bytes=w.kv_writes * kv_slot,
            kv_blocks_s=w.blocks * spec.num_layers * BLOCK_S,
            batch_split=np.where(np.asarray(w.prefill_pairs) > 0, self.prefill_batch_split, 1)
            if isinstance(w.prefill_pairs, np.ndarray)
            else (self.prefill_batch_split if w.prefill_pairs > 0 else 1),
        )

    def _rows_amounts(self, tokens: Any, sampled: Any) -> dict[str, Any]:
        """The amounts set by a step's rows alone: by its tokens (its GEMMs and
        all-reduces) and by its sampled rows (its lm head)."""
        return {**self._token_amounts(tokens), **self._sampled_amounts(sampled)}

    def _token_amounts(self, tokens: Any) -> dict[str, Any]:
        """The amounts a step's tokens set, kept per count for plain numbers: steps repeat
        few of them (a mixed step's chunk and decode rows, a decode step's rows)."""
        plain = isinstance(tokens, int | float)
        known = self._by_tokens.get(tokens) if plain else None
        if known is not None:
            return known
        spec, tp = self.spec, self.tp
        sharded = tp > 1 and tokens > 0
        amounts = {
            "linear_flops": spec.linear_flops(tokens, tp),
            "linear_bytes": spec.linear_bytes(tokens, tp) * self._weight_scale,
            "gemms": GEMMS_PER_LAYER * spec.num_layers if tokens > 0 else 0,
            "allreduce_bytes": spec.allreduce_bytes(tokens, tp),
            "allreduce_calls": ALLREDUCES_PER_LAYER * spec.num_layers if sharded else 0,
        }
        if spec.moe is not None:  # the routed experts by what the busiest rank gets
            amounts |= token_amounts(spec, tp, tokens, self.parallel, self._weight_scale)
        if plain:
            self._by_tokens[tokens] = amounts
        return amounts

    def _sampled_amounts(self, sampled: Any) -> dict[str, Any]:
        """The amounts a step's sampled rows set (its lm head), kept per count likewise."""
        plain = isinstance(sampled, int | float)
        known = self._by_sampled.get(sampled) if plain else None
        if known is not None:
            return known
        amounts = {
            "lm_head_flops": self.spec.lm_head_flops(sampled, self.tp),
            "lm_head_bytes": self.spec.lm_head_bytes(sampled, self.tp),
        }
        if plain:
            self._by_sampled[sampled] = amounts
        return amounts

    def rooflines(self, shape: StepShape) -> dict[str, float]:
        """Each term's roofline time in seconds, before its coefficient."""
        return {term: float(t) for term, t in self._terms(self.amounts(shape)).items()}

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds of each term, the overhead and the recompile penalty; they sum to the step."""
        c = self._timing
        parts = {term: c[term] * t for term, t in self.rooflines(shape).items()}
        parts[OVERHEAD] = c[OVERHEAD]
        parts[RECOMPILE] = self.hardware.recompile_s if shape.miss else 0.0
        return parts

    def step_time(self, shape: StepShape) -> float:
        """The sum of breakdown(shape), without building it (a simulated device's every
        step); a decode-only step on a device that computes real tokens by its row count's
        decode_rates, as decode_seconds prices a run of them."""
        recompile = self.hardware.recompile_s if shape.miss else 0.0
        if self.hardware.pads_to_buckets:
            return float(self.seconds_of(self.amounts(shape))) + recompile
        if shape.prefill is None:
            rows, slots, blocks = decode_sums(shape)
            if rows >= len(self._decode_rates):
                self._decode_rate_table(rows)
            fixed, per_slot, per_block = self._decode_rates[rows]
            return fixed + per_slot * slots + per_block * blocks + recompile
        if self.prefill_batch_split > 1:  # its all-reduce hides under its compute
            return float(self.seconds_of(self.amounts(shape))) + recompile
        return self._mixed_seconds(real_work(shape)) + recompile

    def _mixed_seconds(self, w: StepWork) -> float:
        """A step with a prefill on a device that computes real tokens, its batch not split:
        what its tokens set (GEMMs, KV writes, all-reduces) and what its sampled rows set
        (the lm head), each kept per count, its prefill attention (a roofline of its
        query-key pairs and its keys), its KV slots and blocks at their rates, the overhead
        (separable_rates)."""
        rates = self._separable or self.separable_rates()
        token = self._token_seconds.get(w.linear_tokens)
        if token is None:
            token = self._token_seconds[w.linear_tokens] = self._part_seconds(
                StepWork(w.linear_tokens, kv_writes=w.linear_tokens)
            )
        sampled = self._sampled_seconds.get(w.sampled_rows)
        if sampled is None:
            sampled = self._sampled_seconds[w.sampled_rows] = self._part_seconds(
                StepWork(sampled_rows=w.sampled_rows)
            )
        prefill = max(w.prefill_pairs * rates.per_pair, w.prefill_keys * rates.per_key)
        decode = w.decode_slots * rates.per_slot + w.blocks * rates.per_block
        return token + sampled + prefill + decode + rates.overhead

    def separable_rates(self) -> SeparableRates:
        """The seconds of one query-key pair, one key, one KV slot and one block, each from
        the terms themselves, and the overhead: with what a step's tokens and its sampled
        rows set, the parts _mixed_seconds sums. Steps far out check that the terms still
        fall apart so (no term reads two parts, the prefill attention is a roofline)."""
        pair, key, slot, block = (
            self._part_seconds(StepWork(*one))
            for one in ((0, 1, 0, 0, 0, 0, 0), (0, 0, 1, 0, 0, 0, 0))
            + ((0, 0, 0, 1, 0, 0, 0), (0, 0, 0, 0, 0, 0, 1))
        )
        overhead = self._timing[OVERHEAD]
        self._separable = rates = SeparableRates(pair, key, slot, block, overhead)
        # Prefill attention bound by its FLOPs, by its keys, and at about the ridge.
        keys = 1 << 20
        pairs = max(1, round(keys * rates.per_key / rates.per_pair)) if rates.per_pair else 1
        for ways in ((pairs, keys), (4 * pairs, keys), (pairs, 4 * keys)):
            far = StepWork(5000, *ways, 1 << 24, 5000, 300, 1 << 20)
            exact = float(self.seconds_of(self.amounts_of(far)))
            by_parts = self._mixed_seconds(far)
            if not math.isclose(by_parts, exact, rel_tol=1e-9):
                self._separable = None
                raise RuntimeError(
                    f"a mixed step of {far} takes {exact} s, not the {by_parts} s its parts "
                    "give: the terms no longer fall apart into what tokens, sampled rows, "
                    "prefill attention, KV slots and blocks set, and _mixed_seconds needs "
                    "another form"
                )
        return rates

    def _part_seconds(self, work: StepWork) -> float:
        """The terms' seconds of a part of a step's work, without the overhead."""
        return sum(self._weighted_terms(work).values())

    def seconds_of(self, amounts: StepAmounts) -> Any:
        """Seconds of steps given by their amounts (stacked: an array, one per step): the
        terms times their coefficients plus the overhead, compiles left out. What a fit
        re-times recorded steps with for other hardware figures."""
        c = self._timing
        return sum(c[term] * t for term, t in self._terms(amounts).items()) + c[OVERHEAD]

    def on(self, hardware: HardwareProfile) -> CostModel:
        """The same model, tp, precision and batch split on other hardware figures."""
        return CostModel(
            self.spec,
            hardware,
            self.tp,
            precision=self.precision,
            prefill_batch_split=self.prefill_batch_split,
            parallel=self.parallel,
        )

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
        a, b = self._design(samples)
        return fit_coefficients(self.coefficients, (*TERMS, OVERHEAD), a, b, terms, relative)

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
