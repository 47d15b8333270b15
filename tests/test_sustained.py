"""Sustained capacity: a probe serves at least capacity.min_requests and turnover x its
in-flight count (Little's law, measured), a probe whose TTFT still grows over its second
half is a miss, and the capacity found holds when served on 3 x the requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.plan.capacity import capacity_search
from pipeline.plan.sustained import SustainedRule, in_flight, ttft_growth
from stages.scheduling.request import Request
from tests.helpers import make_config
from tests.test_capacity import SMALL_DEPLOYMENT, attainment_when_served


def test_the_rule_by_hand():
    rule = SustainedRule(min_requests=1000, turnover=20, growth_limit=0.2)
    assert rule.requests(40, in_flight=10.0) == 1000
    assert rule.requests(40, in_flight=60.5) == 1210  # 20 x 60.5
    assert rule.requests(5000, in_flight=60.5) == 5000
    # 102 req/s at 11.5 s a request: 1,173 in flight (the burst the rule exists for)
    metrics = {"offered_rps": 102.0, "e2e_ms": {"mean": 11500.0}}
    assert in_flight(metrics, concurrency=0) == pytest.approx(1173.0)
    assert in_flight(metrics, concurrency=8) == 8.0


def served(arrival_s: float, ttft_s: float) -> Request:
    r = Request(f"r{arrival_s}", int(arrival_s), "", [1, 2], 4, arrival_s=arrival_s)
    r.token_times = [arrival_s + ttft_s]
    return r


def test_a_ttft_that_still_grows_is_caught_and_a_flat_one_is_not():
    growing = [served(t, 0.2 + 0.01 * t) for t in range(400)]  # a queue filling: +1 s / 100 s
    verdict = ttft_growth(growing, ttft_bound_ms=2000.0, limit=0.2)
    assert verdict is not None and verdict.grew
    # quarters of 100: medians at t = 249.5 and 349.5: 2.695 s and 3.695 s
    assert (verdict.third_ms, verdict.fourth_ms) == pytest.approx((2695.0, 3695.0))
    assert verdict.allowed_ms == pytest.approx(0.2 * 2695.0)
    flat = [served(t, 0.3 + 0.05 * (t % 3)) for t in range(400)]  # noise around 350 ms
    verdict = ttft_growth(flat, ttft_bound_ms=2000.0, limit=0.2)
    assert verdict is not None and not verdict.grew
    assert ttft_growth(flat[:5], 2000.0, 0.2) is None
    # a clock handing numpy floats: the verdict is still a plain bool (metrics.json holds it)
    numpy_clock = [served(t, float(t)) for t in range(40)]
    for r in numpy_clock:
        r.token_times = [np.float64(r.token_times[0])]
    assert type(ttft_growth(numpy_clock, 2000.0, 0.2).grew) is bool


def test_every_met_probe_is_long_enough_and_the_capacity_holds_on_3x(tmp_path):
    cfg = make_config([*SMALL_DEPLOYMENT, "workload.rate=2", "capacity.sustained=true",
                       "capacity.min_requests=100", "capacity.turnover=20",
                       "capacity.tolerance=0.2"])  # fmt: skip
    result = capacity_search(cfg, tmp_path)
    assert result["capacity_found"]
    probes = json.loads((tmp_path / "capacity.json").read_text())["probes"]
    for p in probes:
        metrics = json.loads((tmp_path / p["folder"] / "metrics.json").read_text())
        if p["met"]:
            assert metrics["num_requests"] >= 100
            assert metrics["num_requests"] >= 20 * in_flight(metrics, 0) - 1e-9
            assert not metrics["ttft_growth"]["grew"]
    held = make_config([*SMALL_DEPLOYMENT, f"workload.num_requests={3 * result['num_requests']}"])
    # at the rate its probe's arrivals came at (the sizing's capacity: target.py)
    rate = min(result["capacity"], result["capacity_rps"])
    assert attainment_when_served(held, "workload.rate", rate) >= 0.9
