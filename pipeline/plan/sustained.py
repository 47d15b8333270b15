"""A capacity counts only at steady state: the rule a probe is served and judged by.

A burst of a few hundred requests can meet an SLO at a rate no server sustains: the
queue has not filled by the time the last request arrives. With `capacity.sustained=true`
(conf/plan.yaml sets it for every plan) a probe of an open loop at a request rate:

- serves at least `capacity.min_requests` (1,000) and at least `capacity.turnover` (20)
  times its in-flight count, the rate times the mean latency (Little's law), so that the
  requests in flight turn over many times. The in-flight count is measured: a probe that
  met its SLO on fewer requests than the rule asks of its own in-flight count is served
  again, longer. A closed loop's in-flight count is its concurrency. A trace is served
  whole: its own duration.
- is a miss when its TTFT still grows over its second half: the median TTFT of its last
  quarter of arrivals exceeds the third quarter's by more than `capacity.growth_limit`
  (20%) of the larger of that median, the SLO's TTFT bound and 100 ms (below which a
  difference is a step or two of scheduling, not a queue). A growing queue shows first in
  TTFT: every request waits behind it for its first token.

The target check (pipeline/plan/target.py) serves one replica at its share of the target
on 3 x the requests of the search's probe at capacity.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.job.metrics import ttft_s
from pipeline.schema import CapacityConf
from stages.scheduling.request import Request

NOISE_MS = 100.0  # a TTFT difference below this is scheduling noise, not a queue
CHECK_FACTOR = 3  # the target check serves this many times the search's requests


@dataclass(frozen=True)
class SustainedRule:
    min_requests: int
    turnover: float
    growth_limit: float

    @classmethod
    def of(cls, settings: CapacityConf) -> SustainedRule | None:
        """The rule from `capacity.*`; None where capacity.sustained is off."""
        if not settings.sustained:
            return None
        return cls(int(settings.min_requests), float(settings.turnover),
                   float(settings.growth_limit))  # fmt: skip

    def requests(self, own: int, in_flight: float) -> int:
        """Requests a probe serves: its workload's own, at least the rule's."""
        return max(own, self.min_requests, math.ceil(self.turnover * in_flight))


def in_flight(metrics: dict[str, Any], concurrency: int) -> float:
    """Requests in flight on average: the concurrency of a closed loop, else the offered
    rate times the mean latency."""
    if concurrency:
        return float(concurrency)
    rate = metrics.get("offered_rps") or 0.0
    e2e = metrics.get("e2e_ms") or {}
    mean_ms = e2e.get("mean") if isinstance(e2e, dict) else None
    return float(rate) * float(mean_ms or 0.0) / 1000.0


@dataclass(frozen=True)
class Growth:
    """The median TTFT of the third and fourth quarters of arrivals, and the verdict."""

    third_ms: float
    fourth_ms: float
    allowed_ms: float
    grew: bool

    def as_metrics(self) -> dict[str, Any]:
        return asdict(self)


def ttft_growth(requests: Sequence[Request], ttft_bound_ms: float, limit: float) -> Growth | None:
    """The second half's TTFT growth; None with fewer than 8 requests served."""
    timed = sorted((r.arrival_s, t) for r in requests if (t := ttft_s(r)) is not None)
    if len(timed) < 8:
        return None
    quarter = len(timed) // 4
    # plain floats: a device's clock may hand numpy ones, which metrics.json cannot hold
    third = float(statistics.median(t for _, t in timed[-2 * quarter : -quarter])) * 1000
    fourth = float(statistics.median(t for _, t in timed[-quarter:])) * 1000
    allowed = limit * max(third, ttft_bound_ms, NOISE_MS)
    return Growth(third, fourth, allowed, bool(fourth - third > allowed))
