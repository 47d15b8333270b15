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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.metrics import e2e_s, tpot_s, ttft_s
from stages.request import Request


def _tpot_or_zero(r: Request) -> float | None:
    """vLLM's TPOT for goodput: 0 for a request with one output token."""
    if r.token_times and len(r.token_times) < 2:
        return 0.0
    return tpot_s(r)


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

    @property
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
    """Served, and within every bound that is set."""
    return r.finish_reason != "error" and all(
        _met(r, name, bound) for name, bound in slo.bounds.items()
    )


def slo_metrics(requests: Sequence[Request], duration_s: float, slo: Slo) -> dict[str, Any]:
    """metrics.json's SLO keys: `request_goodput` (good requests/s), `slo_attainment` (good
    fraction), `slo_attainment_by_bound` (fraction meeting each bound that is set), `slo`
    (the bounds and the target) and `slo_met` (attainment at or above the target). With no
    bound set, every served request is good."""
    bounds = slo.bounds
    served = [r for r in requests if r.finish_reason != "error"]
    passed = {name: [_met(r, name, bound) for r in served] for name, bound in bounds.items()}
    good = sum(all(row) for row in zip(*passed.values(), strict=True)) if bounds else len(served)
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
