"""The simulated device: the real scheduler and metadata builder on shapes, a virtual clock."""

from __future__ import annotations

import time

import pytest

from pipeline.job.run import device_metrics
from stages.simulator.hardware import kv_pool_blocks
from tests.helpers import serve

WORKLOAD = [
    "workload.num_requests=10",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=120",
    "workload.min_new_tokens=3",
    "workload.max_new_tokens=12",
]
SIMULATED = ["executor=simulated", "hardware=gaudi3"]


def plans(steps) -> list[tuple]:
    return [(s.mode, [(c["id"], c["start"], c["end"]) for c in s.prefill], s.decode) for s in steps]


@pytest.mark.parametrize(
    "overrides",
    [["max_tokens=32", "num_blocks=14"], ["max_tokens=64", "scheduler=whole", "num_blocks=40"]],
    ids=["chunked with preemption", "whole"],
)
def test_a_simulated_run_schedules_exactly_as_the_real_one(overrides):
    real_steps, sim_steps = [], []
    real, _ = serve([*WORKLOAD, *overrides], steps=real_steps)
    simulated, engine = serve([*WORKLOAD, *overrides, *SIMULATED], steps=sim_steps)
    assert plans(sim_steps) == plans(real_steps)
    assert [s.padded_tokens for s in sim_steps] == [s.padded_tokens for s in real_steps]
    assert all(len(simulated[i].output_ids) == len(r.output_ids) for i, r in real.items())
    if "num_blocks=14" in overrides:
        assert sum(r.num_preemptions for r in real.values()) > 0, "no preemption to compare"


def test_the_clock_is_virtual_deterministic_and_skips_idle_gaps():
    slow_arrivals = [*WORKLOAD, *SIMULATED, "workload.rate=0.01", "warmup=true"]
    start = time.perf_counter()
    first, engine = serve(slow_arrivals)
    assert time.perf_counter() - start < 60  # arrivals ~100 s apart are not waited for
    last_arrival = max(r.arrival_s for r in first.values())
    assert last_arrival > 300
    assert max(r.finish_s for r in first.values()) > last_arrival
    second, _ = serve(slow_arrivals)
    assert [r.token_times for r in first.values()] == [r.token_times for r in second.values()]


def test_each_unprepared_shape_compiles_once_during_serving():
    warm, engine = serve([*WORKLOAD, *SIMULATED, "warmup=true"])
    assert engine.model.recompiles == 0
    # One decode batch size prepared: larger decode batches miss and compile once each.
    narrow = ["metadata.decode_batch.step=1", "metadata.decode_batch.max=1", "warmup=true"]
    missed, engine = serve([*WORKLOAD, *SIMULATED, *narrow])
    compiles = engine.model.recompiles
    assert 0 < compiles <= engine.metadata.bucket_misses
    penalty = engine.model.hardware.recompile_s
    finish = max(r.finish_s for r in missed.values())
    assert finish - max(r.finish_s for r in warm.values()) >= compiles * penalty * 0.99


def test_metrics_name_the_device_and_predict_warmup():
    _, engine = serve([*WORKLOAD, *SIMULATED, "model=spec/llama31_8b"])
    metrics = device_metrics(engine)
    assert metrics["simulated"] is True and metrics["hardware"] == "gaudi3"
    assert metrics["predicted_warmup_s"] == metrics["warmup_shapes"] * 10.0  # compile_s
    spec, hardware = engine.model.spec, engine.model.hardware
    assert engine.scheduler.kv_cache.num_blocks == kv_pool_blocks(spec, hardware, 16, 1)
