"""Closed-loop load (`workload.concurrency`): never more than N requests in flight, none
sent before its own arrival, and each freed slot taken by the next waiting request."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from tests.helpers import make_config

SIMULATED = ["executor=simulated", "hardware=gaudi3"]


def served(overrides: list[str] | DictConfig):
    """The run's requests, with each one's arrival as the workload gave it."""
    cfg = overrides if isinstance(overrides, DictConfig) else make_config(overrides)
    engine, requests = build_engine(cfg)
    given_arrivals = {r.id: r.arrival_s for r in requests}
    engine.run(requests)
    return requests, given_arrivals


def most_in_flight(requests) -> int:
    """The most requests between their sending and their finish at any sending time (one
    that finishes at the instant another is sent has left)."""
    spans = [(r.arrival_s, r.finish_s) for r in requests if r.finish_reason != "error"]
    return max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans)


@pytest.fixture(scope="module")
def simulated_config() -> DictConfig:
    return make_config(SIMULATED)  # composed once: the examples set their values on a copy


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limit=st.integers(1, 5),
    rate=st.sampled_from([0.0, 2.0, 50.0]),
    seed=st.integers(0, 3),
)
def test_never_more_than_n_in_flight_nor_before_arrival(simulated_config, limit, rate, seed):
    cfg = simulated_config.copy()
    cfg.workload.concurrency, cfg.workload.rate, cfg.workload.seed = limit, rate, seed
    requests, given_arrivals = served(cfg)
    assert all(r.finish_reason == "length" for r in requests)
    assert most_in_flight(requests) <= limit
    assert all(r.arrival_s >= given_arrivals[r.id] for r in requests)
    if rate == 0.0:  # all waiting from the start: the limit binds, every slot busy at once
        assert most_in_flight(requests) == min(limit, len(requests))
        # a held-back request is sent exactly when some request finishes
        finishes = {r.finish_s for r in requests}
        assert all(r.arrival_s in finishes for r in requests if r.arrival_s > 0)


def test_open_loop_is_unchanged_and_the_real_forward_honours_the_limit():
    requests, given_arrivals = served(["workload.concurrency=2"])  # the Paddle forward
    assert most_in_flight(requests) == 2
    assert all(r.arrival_s >= given_arrivals[r.id] for r in requests)
    open_loop, given_open = served([*SIMULATED])
    assert {r.id: r.arrival_s for r in open_loop} == given_open
    assert most_in_flight(open_loop) > 2


def test_jsonl_and_trace_workloads_take_the_limit(tmp_path):
    lines = [{"prompt": "word " * (5 + i), "max_new_tokens": 4, "arrival_s": 0} for i in range(6)]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    requests, _ = served(
        [*SIMULATED, "workload=jsonl", f"workload.path={path}", "workload.concurrency=2"]
    )
    assert most_in_flight(requests) == 2
    trace = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:15:{i:02d}.0000000,{40 + i},{3 + i % 4}" for i in range(8)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    requests, _ = served(
        [
            *SIMULATED,
            "workload=trace",
            f"workload.path={trace}",
            "workload.concurrency=3",
            "workload.time_scale=0.001",
        ]
    )
    assert most_in_flight(requests) == 3


def test_a_negative_limit_is_one_line():
    with pytest.raises(ConfigError, match="workload.concurrency=-1"):
        build_engine(make_config([*SIMULATED, "workload.concurrency=-1"]))
