"""Serving metrics with the field's definitions (as vLLM's benchmarks report them).

Times are seconds since the run's start. Per request: TTFT is arrival to the first output
token; E2E is arrival to the finish; TPOT is (E2E - TTFT) / (output tokens - 1), so it
runs to the finish time, which is the last token's time unless the request ends later;
ITL is every gap between consecutive output tokens. Aggregates are mean, p50, p90 and p99
(numpy's linear interpolation) over served requests, and ITL over all their gaps; a
request with one output token has no TPOT and no gap.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stages.scheduling.request import DecodeRun, FinishReason, Request


class StepCounts(Protocol):
    """What a run's metrics read of a step (pipeline.run_folder.records.StepRecord holds it)."""

    num_tokens: int
    padded_tokens: int


@dataclass
class StepTotals:
    """What a run's metrics need of its steps, as running sums: a run that writes no
    steps.jsonl (a capacity-search probe) keeps no step records."""

    num_steps: int = 0
    num_tokens: int = 0
    padded_tokens: int = 0

    def add(self, record: StepCounts) -> None:
        self.num_steps += 1
        self.num_tokens += record.num_tokens
        self.padded_tokens += record.padded_tokens

    def add_run(self, run: DecodeRun) -> None:
        """A run of decode steps done at once (a simulated device's leap)."""
        self.num_steps += run.steps
        self.num_tokens += run.num_tokens
        self.padded_tokens += run.padded_tokens

    @classmethod
    def of(cls, steps: Sequence[StepCounts]) -> StepTotals:
        totals = cls()
        for record in steps:
            totals.add(record)
        return totals


def stats(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    if len(values) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def ttft_s(r: Request) -> float | None:
    """Arrival to the first output token."""
    return r.token_times[0] - r.arrival_s if r.token_times else None


def e2e_s(r: Request) -> float | None:
    """Arrival to the finish, for a request that produced output."""
    return r.finish_s - r.arrival_s if r.finish_s is not None and r.token_times else None


def itl_s(r: Request) -> list[float]:
    """Every gap between consecutive output tokens (float subtraction, as numpy's diff)."""
    times = r.token_times
    return list(map(operator.sub, times[1:], times[:-1]))


def tpot_s(r: Request) -> float | None:
    """(e2e - TTFT) / (output tokens - 1): the mean time per token after the first."""
    n = len(r.token_times)
    e2e, ttft = e2e_s(r), ttft_s(r)
    if n < 2 or e2e is None or ttft is None:
        return None
    return (e2e - ttft) / (n - 1)


def itl_ms(requests: Sequence[Request]) -> np.ndarray:
    """Every gap between consecutive output tokens of the requests, in ms, as one array (a
    trace's requests have tens of millions): the gaps of all their times in one row, less
    those from one request's last token to the next one's first."""
    times = [r.token_times for r in requests if len(r.token_times) > 1]
    if not times:
        return np.zeros(0)
    lengths = np.fromiter(map(len, times), np.int64, len(times))
    flat = np.fromiter(itertools.chain.from_iterable(times), np.float64, int(lengths.sum()))
    gaps = flat[1:] - flat[:-1]
    return np.delete(gaps, np.cumsum(lengths[:-1]) - 1) * 1e3


def summarise(
    requests: Sequence[Request], steps: Sequence[StepCounts] | StepTotals, duration_s: float
) -> dict[str, Any]:
    served = [r for r in requests if r.finish_reason != FinishReason.ERROR]
    output_tokens = sum(len(r.output_ids) for r in requests)
    totals = steps if isinstance(steps, StepTotals) else StepTotals.of(steps)
    real, padded = totals.num_tokens, totals.padded_tokens
    prompt = sum(len(r.prompt_ids) for r in served)
    cached = sum(r.cached_tokens for r in served)

    def ms(values: list[float | None]) -> dict[str, float | None]:
        return stats([v * 1e3 for v in values if v is not None])

    return {
        "num_requests": len(requests),
        "num_errors": len(requests) - len(served),
        "input_tokens": sum(len(r.prompt_ids) for r in requests),
        "output_tokens": output_tokens,
        "num_steps": totals.num_steps,
        "duration_s": duration_s,
        "output_throughput": output_tokens / duration_s if duration_s > 0 else 0.0,
        "ttft_ms": ms([ttft_s(r) for r in served]),
        "tpot_ms": ms([tpot_s(r) for r in served]),
        "itl_ms": stats(itl_ms(served)),
        "e2e_ms": ms([e2e_s(r) for r in served]),
        "token_utilization": real / padded if padded else None,
        "num_preemptions": sum(r.num_preemptions for r in requests),
        "prefix_cache_hit_rate": cached / prompt if prompt else None,
    }
