"""Serving metrics on hand-built timelines, against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.job.metrics import e2e_s, itl_ms, itl_s, stats, summarise, tpot_s, ttft_s
from pipeline.run_folder.records import StepRecord
from stages.scheduling.request import Request, Status


def timeline(rid: str, arrival: float, token_times: list[float], finish: float | None = None):
    """A finished request whose tokens came at the given times (seconds since the start)."""
    r = Request(rid, 0, "p", [1, 2, 3], max_new_tokens=len(token_times), arrival_s=arrival)
    r.output_ids = [7] * len(token_times)
    r.token_times = token_times
    r.status = Status.FINISHED
    r.finish_reason = "length"
    r.finish_s = token_times[-1] if finish is None else finish
    return r


def step(num_tokens: int, padded_tokens: int) -> StepRecord:
    return StepRecord(0, "decode", [], [], [], num_tokens, padded_tokens, "b", 0.1)


@pytest.fixture
def served():
    failed = Request("bad", 3, "", [], max_new_tokens=0)
    failed.fail("empty prompt", 0.0)
    return [
        timeline("a", 1.0, [1.5, 1.7, 2.0, 2.6]),  # TTFT 0.5, gaps 0.2 0.3 0.6, E2E 1.6
        timeline("b", 0.0, [0.4]),  # one token: TTFT 0.4, no TPOT, no gap
        timeline("c", 0.3, [1.0, 1.1, 1.3]),  # TTFT 0.7, gaps 0.1 0.2, E2E 1.0, TPOT 0.15
        failed,
    ]


def test_per_request_definitions(served):
    a, b, c, _ = served
    assert ttft_s(a) == pytest.approx(0.5)
    assert e2e_s(a) == pytest.approx(1.6)
    assert itl_s(a) == pytest.approx([0.2, 0.3, 0.6])
    assert tpot_s(a) == pytest.approx((1.6 - 0.5) / 3)
    assert tpot_s(b) is None and itl_s(b) == []
    assert tpot_s(c) == pytest.approx((1.0 - 0.7) / 2)


def test_tpot_runs_to_the_finish_not_the_last_token():
    # Ended 0.5 s after its last token (e.g. by a stop check): E2E - TTFT = 3.5 - 1.0.
    r = timeline("late", 0.0, [1.0, 2.0, 3.0], finish=3.5)
    assert tpot_s(r) == pytest.approx(1.25)
    assert itl_s(r) == pytest.approx([1.0, 1.0])


def test_summary_percentiles_by_hand(served):
    m = summarise(served, [step(6, 8), step(2, 8)], duration_s=3.5)
    assert m["num_requests"] == 4 and m["num_errors"] == 1
    assert m["output_tokens"] == 8 and m["input_tokens"] == 9
    assert m["output_throughput"] == pytest.approx(8 / 3.5)
    assert m["token_utilization"] == pytest.approx(0.5)
    # TTFT 400 500 700 ms: linear interpolation at ranks 0.9 * 2 and 0.99 * 2.
    assert m["ttft_ms"] == pytest.approx({"mean": 1600 / 3, "p50": 500, "p90": 660, "p99": 696})
    # TPOT 150 and 366.67 ms, the one-token request left out.
    tpot_a = 1100 / 3
    assert m["tpot_ms"] == pytest.approx(
        {
            "mean": (150 + tpot_a) / 2,
            "p50": (150 + tpot_a) / 2,
            "p90": 150 + 0.9 * (tpot_a - 150),
            "p99": 150 + 0.99 * (tpot_a - 150),
        }
    )
    # ITL over all five gaps, 100 200 200 300 600 ms: ranks 3.6 and 3.96.
    assert m["itl_ms"] == pytest.approx({"mean": 280, "p50": 200, "p90": 480, "p99": 588})
    # E2E 400 1000 1600 ms.
    assert m["e2e_ms"] == pytest.approx({"mean": 1000, "p50": 1000, "p90": 1480, "p99": 1588})


def test_empty_values_give_nulls():
    assert stats([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    only_one_token = [timeline("x", 0.0, [0.2])]
    m = summarise(only_one_token, [], duration_s=0.2)
    assert m["itl_ms"]["p99"] is None and m["tpot_ms"]["mean"] is None
    assert m["ttft_ms"]["p50"] == pytest.approx(200)
    assert m["token_utilization"] is None


def test_token_gaps_equal_numpys_differences_request_by_request():
    rng = np.random.default_rng(5)
    requests = [
        timeline(f"r{i}", 0.0, np.cumsum(rng.random(n)).tolist()) if n else timeline("e", 0, [0])
        for i, n in enumerate([5, 1, 0, 9, 2, 1, 30])
    ]
    for r in requests:
        assert itl_s(r) == np.diff(r.token_times).tolist()  # exactly, not approximately
    oracle = np.concatenate([np.diff(r.token_times) for r in requests]) * 1e3
    assert np.array_equal(itl_ms(requests), oracle)
    assert len(itl_ms(requests[1:3])) == 0
