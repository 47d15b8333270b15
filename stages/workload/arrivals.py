"""When a workload's requests arrive: Poisson arrivals, the closed-loop limit, and the one
bound on arrival times every workload keeps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stages.scheduling.request import Request


def poisson_arrivals(
    count: int, rate: float, rng: np.random.Generator, start_s: float = 0.0
) -> list[float]:
    """Arrival times of a Poisson process at `rate` requests/s from `start_s`: exponential
    gaps of mean 1/rate, the first one included. All at `start_s` when rate is 0."""
    if rate <= 0:
        return [start_s] * count
    return (start_s + np.cumsum(rng.exponential(1.0 / rate, size=count))).tolist()


def closed_loop(concurrency: int) -> int:
    """`workload.concurrency`, checked: the most requests in flight, 0 for open loop."""
    if not isinstance(concurrency, int) or concurrency < 0:
        raise ValueError(
            f"workload.concurrency={concurrency}: give the most requests in flight at once "
            "(closed loop), or 0 for open-loop arrivals"
        )
    return concurrency


# A day: later arrivals are a unit mistake (ms for s), and would idle the run for ever.
MAX_ARRIVAL_S = 86_400.0


def bound_arrivals(requests: Sequence[Request]) -> None:
    """The arrival rule of every workload (synthetic, multi-turn, jsonl, traces, after their
    shift and scale): a request arriving outside the first day, or at no number, ends at
    once with the reason, and the others are served, as a malformed jsonl line does."""
    for r in requests:
        if not r.finished and not 0 <= r.arrival_s <= MAX_ARRIVAL_S:  # False for NaN too
            r.fail(
                f"arrives at {r.arrival_s:.6g} s, not within the run's first day (0 to "
                f"{MAX_ARRIVAL_S:.0f} s): shorten or speed up the workload (workload."
                "duration_s, workload.time_scale, workload.rate) or fix its arrival",
                0.0,
            )
