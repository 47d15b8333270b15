"""Service-level objectives and goodput, with vLLM's definitions (`vllm bench serve
--goodput ttft:MS tpot:MS e2el:MS`).

A request is good when it was served and met every bound that is set (a value at most the
bound counts as met). TPOT is (E2E - TTFT) / (output tokens - 1), and 0 for a request with
one output token, as vLLM counts it, so such a request meets any TPOT bound. Goodput is good
requests per second of the run; attainment is the fraction of all the run's requests that
were good (a failed request is never good), and each bound's attainment the fraction that
met that bound.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.job.metrics import e2e_s, tpot_s, ttft_s
from stages.scheduling.request import FinishReason, Request


def _tpot_or_zero(r: Request) -> float | None:
    """vLLM's TPOT for goodput: 0 for a request with one output token."""
    if r.token_times and len(r.token_times) < 2:
        return 0.0
    return tpot_s(r)


RequestTest = Callable[[Request], bool]

# (bound's key, the request's value in seconds, or None when it has none)
MEASURES: dict[str, Callable[[Request], float | None]] = {
    "ttft_ms": ttft_s,
    "tpot_ms": _tpot_or_zero,
    "e2e_ms": e2e_s,
}


@dataclass(frozen=True)
class Slo:
    """The bounds in ms (0 = no bound) and the fraction of requests that must meet them all."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    e2e_ms: float = 0.0
    attainment: float = 0.9

    def __post_init__(self) -> None:
        for name in MEASURES:
            value = getattr(self, name)
            if not value >= 0:  # also refuses NaN
                raise ValueError(f"slo.{name}={value}: give a bound in ms, or 0 for none")
        if not 0 < self.attainment <= 1:
            raise ValueError(
                f"slo.attainment={self.attainment}: give the fraction of requests that must "
                "meet the bounds, above 0 and at most 1 (e.g. 0.9)"
            )

    @classmethod
    def of(cls, node: Mapping[str, Any] | None) -> Slo:
        return cls(**dict(node or {}))

    @functools.cached_property  # asked at every finish of a probe: made once
    def bounds(self) -> dict[str, float]:
        """The bounds that are set, by key."""
        return {name: getattr(self, name) for name in MEASURES if getattr(self, name) > 0}

    def describe(self) -> str:
        """`ttft <= 2000 ms, tpot <= 50 ms`, or `none`."""
        parts = [f"{name[:-3]} <= {bound:g} ms" for name, bound in self.bounds.items()]
        return ", ".join(parts) or "none"


def _met(r: Request, name: str, bound_ms: float) -> bool:
    value = MEASURES[name](r)
    return value is not None and value * 1e3 <= bound_ms


def is_good(r: Request, slo: Slo) -> bool:
    """Served, and within every bound that is set (asked at every finish of a probe: with
    no bound set, without looking for one)."""
    bounds = slo.bounds
    return r.finish_reason != FinishReason.ERROR and (
        not bounds or all(_met(r, name, bound) for name, bound in bounds.items())
    )


def slo_was_set(metrics: Mapping[str, Any]) -> bool:
    """Whether a run had an SLO bound (metrics' `slo` holds the target besides): without
    one, attainment, slo_met and goodput say nothing."""
    return len(metrics.get("slo") or {}) > 1


def slo_metrics(requests: Sequence[Request], duration_s: float, slo: Slo) -> dict[str, Any]:
    """metrics.json's SLO keys: `request_goodput` (good requests/s), `slo_attainment` (good
    fraction), `slo_attainment_by_bound` (fraction meeting each bound that is set), `slo`
    (the bounds and the target) and `slo_met` (attainment at or above the target). With no
    bound set there is nothing to attain: `slo` alone, with its target."""
    bounds = slo.bounds
    if not bounds:
        return {"slo": {"attainment": slo.attainment}}
    served = [r for r in requests if r.finish_reason != FinishReason.ERROR]
    passed = {name: [_met(r, name, bound) for r in served] for name, bound in bounds.items()}
    good = sum(all(row) for row in zip(*passed.values(), strict=True))
    total = len(requests)
    attainment = good / total if total else None
    return {
        "request_goodput": good / duration_s if duration_s > 0 else 0.0,
        "slo_attainment": attainment,
        "slo_attainment_by_bound": {
            name: (sum(met) / total if total else None) for name, met in passed.items()
        },
        "slo": {**bounds, "attainment": slo.attainment},
        "slo_met": attainment is not None and attainment >= slo.attainment,
    }


def needed_good(total: int, attainment: float) -> int:
    """The fewest good requests of `total` that meet the target, by the same comparison
    slo_metrics makes (good / total >= attainment)."""
    need = min(total, max(0, int(attainment * total)))
    while need > 0 and (need - 1) / total >= attainment:
        need -= 1
    while need < total and need / total < attainment:
        need += 1
    return need


# A bound's deadline is put this much later, relatively: a request found late by the clock
# is late by its own (e2e - ttft) / (n - 1) arithmetic too, whatever the rounding.
MARGIN = 1e-9


class Deadlines:
    """Requests in arrival order, passed once each when the clock goes beyond arrival +
    bound; `late` says whether a passed request is then certain to miss that bound."""

    def __init__(self, ordered: Sequence[Request], bound_ms: float, late: RequestTest) -> None:
        self.ordered = ordered if bound_ms > 0 else ()
        self.bound_s = bound_ms / 1e3 * (1 + MARGIN)
        self.late = late
        self.next = 0

    def next_due(self) -> float:
        """When the next request's bound runs out (math.inf: none left)."""
        if self.next == len(self.ordered):
            return math.inf
        return self.ordered[self.next].arrival_s + self.bound_s

    def passed(self, now: float) -> list[Request]:
        """The requests whose bound ran out by `now` and that are late, each once."""
        late = []
        while now > self.next_due():
            r = self.ordered[self.next]
            self.next += 1
            if self.late(r):
                late.append(r)
        return late


class PaceWatch:
    """TPOT in flight: a request whose first token came at t1 and that may still make at
    most max_new_tokens in all has TPOT >= (its last token's time - t1) / (max_new_tokens -
    1); once the clock passes t1 + bound x (max_new_tokens - 1) without its last token, it
    misses the bound whatever follows. Requests join once they have a first token, in
    arrival order (a late first token holds the later ones back: later, never wrong)."""

    def __init__(self, ordered: Sequence[Request], bound_ms: float) -> None:
        self.ordered = ordered if bound_ms > 0 else ()
        self.bound_s = bound_ms / 1e3 * (1 + MARGIN)
        self.next = 0
        self.due: list[tuple[float, int, Request]] = []  # (deadline, seq_id, request)

    def next_due(self) -> float:
        """The earliest deadline of a request that has joined (math.inf: none)."""
        return self.due[0][0] if self.due else math.inf

    def passed(self, now: float) -> list[Request]:
        ordered, due = self.ordered, self.due
        while self.next < len(ordered) and (
            ordered[self.next].token_times or ordered[self.next].finished
        ):
            r = ordered[self.next]
            self.next += 1
            if not r.finished and r.max_new_tokens > 1:
                deadline = r.token_times[0] + self.bound_s * (r.max_new_tokens - 1)
                heapq.heappush(due, (deadline, r.seq_id, r))
        late = []
        while due and now > due[0][0]:
            r = heapq.heappop(due)[2]
            if not r.finished:
                late.append(r)
        return late


class EarlyVerdict:
    """A run's SLO verdict as soon as it is certain: a miss once more requests have missed
    than the target allows, whatever the others do. The engine asks it before each step
    (a stop hook, pipeline/job/stop_hook.py); on_finish counts each request as it ends. A request
    counts as missed when it ended outside a bound (or failed), or while still in flight
    once it can no longer meet a bound: its TTFT bound passed without a first token, or its
    E2E bound without its last (only where arrival times are fixed, the open loop: a closed
    loop sends a held-back request later, and its clock starts then), or too little time
    left for its remaining tokens within the TPOT bound (PaceWatch)."""

    def __init__(self, slo: Slo, requests: Sequence[Request], arrivals_fixed: bool) -> None:
        self.slo = slo
        self.total = len(requests)
        self.allowed = self.total - needed_good(self.total, slo.attainment)
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        fixed = ordered if arrivals_fixed else []
        watches: list[Deadlines | PaceWatch] = [
            Deadlines(fixed, slo.ttft_ms, lambda r: not r.finished and not r.token_times),
            Deadlines(fixed, slo.e2e_ms, lambda r: not r.finished),
            PaceWatch(ordered, slo.tpot_ms),
        ]
        # Only the bounds that are set have requests to watch: the others are never asked
        # (the engine asks before every step).
        self.watches = [watch for watch in watches if watch.ordered]
        self.missed: set[int] = set()  # seq_ids of the requests counted as missed
        self.missed_in_flight = 0
        self.finished = 0
        self.decided_at: float | None = None
        self.now = 0.0  # the clock at the last call

    def on_finish(self, r: Request) -> None:
        self.finished += 1
        if r.seq_id not in self.missed and not is_good(r, self.slo):
            self.missed.add(r.seq_id)

    def __call__(self, now: float) -> bool:
        """True once the run has missed its SLO for certain (it may stop there)."""
        self.now = now
        for watch in self.watches:
            for r in watch.passed(now):
                if r.seq_id not in self.missed:
                    self.missed.add(r.seq_id)
                    self.missed_in_flight += 1
        if len(self.missed) > self.allowed and self.decided_at is None:
            self.decided_at = now
        return self.decided_at is not None

    def next_change(self) -> float:
        """The next deadline of a request in flight, after the last call. A first token
        may bring another (it ends a leap), and so may a finish that lets later requests
        join the TPOT watch; a leap runs past finishes only while none waits, when every
        request in flight has joined already."""
        if not self.watches:  # no bound set: asked at every leap, the answer never changes
            return math.inf
        due = min([watch.next_due() for watch in self.watches])
        return due if due > self.now else math.nextafter(self.now, math.inf)

    def finishes_before_change(self) -> float:
        """Each finish counts one miss at most: the verdict holds while the misses stay
        within those allowed."""
        return 0 if self.decided_at is not None else self.allowed - len(self.missed)

    def describe(self) -> dict[str, Any]:
        """metrics.json's `decided_early`: the verdict, when, and which requests it counted
        (every other metric covers only the requests that finished before the stop)."""
        return {
            "verdict": "missed",
            "at_s": self.decided_at,
            "requests_finished": self.finished,
            "requests_missed": len(self.missed),
            "missed_in_flight": self.missed_in_flight,
            "missed_allowed": self.allowed,
            "requests_not_finished": self.total - self.finished,
        }
