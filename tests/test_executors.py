"""The executor seam: every executor option has one, chosen by the config alone, and what
each owns (its checks, its clock, its server pool) comes from it."""

from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.executors import EXECUTORS, build_engine, check_config, executor_of
from pipeline.executors.simulated import PacedClock, simulated_device
from pipeline.schema import Executor
from stages.scheduling.kv_cache import blocks_for
from tests.helpers import run_cli

SIMULATED = ["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b"]


def test_every_executor_option_has_an_executor():
    assert set(EXECUTORS) == set(Executor)
    assert not executor_of(compose_config([])).predicts  # the real one by default
    assert executor_of(compose_config(SIMULATED)).predicts
    # A run folder's config written before executors were named ran the real one.
    assert executor_of(OmegaConf.create({"model": {}})) is EXECUTORS[Executor.paddle]


def test_only_the_real_executor_needs_paddle_and_sizes_a_server_pool_itself():
    real, simulated = compose_config([]), compose_config(SIMULATED)
    per_seq = blocks_for(real.max_model_len, real.block_size)
    assert executor_of(real).needs_paddle
    assert executor_of(real).server_num_blocks(real) == real.max_num_seqs * per_seq
    assert not executor_of(simulated).needs_paddle
    assert executor_of(simulated).server_num_blocks(simulated) == 0  # the device's memory


def test_the_executors_own_checks_follow_the_shared_ones():
    with pytest.raises(ConfigError, match="model=spec is a model without weights"):
        check_config(compose_config(["model=spec/llama31_8b"]))
    assert check_config(compose_config(SIMULATED)) is EXECUTORS[Executor.simulated]
    with pytest.raises(ConfigError, match="block_size=3 is not a power of two"):
        check_config(compose_config([*SIMULATED, "block_size=3"]))


# The simulated deployment's keys (the list, written out so that a key the schema
# stops declaring fails here): each set apart from its default, and what the refusal names.
SIMULATED_ONLY = {
    "+hardware=h100": "hardware=h100 is simulated only",
    "tp=2": "tp=2 is simulated only",
    "ep=2": "ep=2 is simulated only",
    "dp=2": "dp=2 is simulated only",
    "ep_imbalance=1.5": "ep_imbalance=1.5 is simulated only",
    "moe_routing_skew=2": "moe_routing_skew=2.0 is simulated only",
    "ep_dispatch=per_rank": "ep_dispatch=per_rank is simulated only",
    "dp_step_spread=0.1": "dp_step_spread=0.1 is simulated only",
    "disagg.prefill_tp=2": "disagg.prefill_tp=2 is simulated only",
    "speculative.tokens=3": "speculative.tokens=3 is simulated only",
    "quantization=fp8": "quantization=fp8 is simulated only",
    "kv_cache_dtype=fp8": "kv_cache_dtype=fp8 is simulated only",
}


@pytest.mark.parametrize("override", sorted(SIMULATED_ONLY))
def test_the_real_executor_refuses_each_simulated_key_in_one_line(override):
    with pytest.raises(ConfigError, match=SIMULATED_ONLY[override]) as err:
        check_config(compose_config([override]))
    assert "\n" not in str(err.value) and "executor=simulated" in str(err.value)


def test_a_simulated_key_at_its_default_passes_the_real_executor():
    check_config(compose_config(["tp=1", "quantization=none", "disagg.prefill=0"]))


# The Paddle executor's keys, each set apart from its default on a simulated run.
PADDLE_ONLY = {
    "num_threads=1": "num_threads=1 is paddle only",
    "device=intel_hpu": "device=intel_hpu is paddle only",
}


@pytest.mark.parametrize("override", sorted(PADDLE_ONLY))
def test_the_simulated_executor_refuses_each_paddle_key_in_one_line(override):
    with pytest.raises(ConfigError, match=PADDLE_ONLY[override]) as err:
        check_config(compose_config([*SIMULATED, override]))
    assert "\n" not in str(err.value) and "executor=paddle" in str(err.value)


def test_a_paddle_key_at_its_default_passes_the_simulated_executor():
    check_config(compose_config([*SIMULATED, "num_threads=2", "device=cpu"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, line",
    [
        (["tp=2"], "Error: tp=2 is simulated only: executor=paddle runs the model as it is"),
        ([*SIMULATED, "num_threads=1"], "Error: num_threads=1 is paddle only: executor=simulated"),
    ],
)
def test_each_executor_refuses_the_others_key_on_the_command_line(tmp_path, overrides, line):
    """As a user types it: exit 2 and one line, before anything is built."""
    done = run_cli(tmp_path, "pipeline", f"hydra.run.dir={tmp_path}", *overrides)
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(line)


def test_a_simulated_engine_has_its_simulation_and_a_real_one_none():
    overrides = [*SIMULATED, "workload.num_requests=2", "workload.max_prompt_tokens=16"]
    engine, _ = build_engine(compose_config(overrides))
    assert engine.simulation is not None
    assert simulated_device(engine) is engine.model
    real, _ = build_engine(compose_config(["workload.num_requests=2"]))
    assert real.simulation is None
    with pytest.raises(ValueError, match="not built by the simulated executor"):
        simulated_device(real)


def test_a_paced_clock_lets_the_predicted_times_pass_on_the_wall():
    clock = PacedClock()
    start = time.perf_counter()
    clock.advance(0.02)
    clock.advance_to(clock() + 0.02)  # a run of steps' end, from the clock's own time
    assert time.perf_counter() - start >= 0.04
    clock.restart()
    assert clock() < 0.02
