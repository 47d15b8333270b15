"""The simulated executor: the real scheduler, KV-cache manager and metadata builder (shapes
only) with a simulated device in place of the forward pass, which predicts each step's
time with the cost model of `hardware` and never imports Paddle."""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Protocol

from omegaconf import DictConfig

from pipeline.config.checks import ConfigError, check_model_context, describe_model
from pipeline.config.engine_profile import check_engine, engine_hardware, host_time
from pipeline.config.executor_keys import refuse_others_keys
from pipeline.disagg.config import check_disagg, disaggregated
from pipeline.executors.build import build, load_workload
from pipeline.executors.fast_forward import workload_fast_forward
from pipeline.job.clock import Clock, WallClock
from pipeline.job.engine import Engine
from pipeline.schema import Executor
from pipeline.speculation.keys import speculation_and_draft
from stages.forward.metadata import ShapeMetadataBuilder
from stages.interfaces import Tokenizer, Workload
from stages.model.spec import ModelSpec
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request
from stages.scheduling.stopping import StopRule
from stages.simulator.device import (
    DeviceClock,
    NoAttention,
    SimulatedDevice,
    VirtualClock,
    WorkloadLengthSampler,
    pick_token,
)
from stages.simulator.expert_parallel import Dispatch, ExpertParallel, check_layout
from stages.simulator.hardware import HardwareProfile, kv_pool_blocks
from stages.simulator.precision import Precision
from stages.simulator.simulation import DeviceSimulation
from stages.simulator.speculative import (
    Speculation,
    accepted_extra,
    pool_with_proposer,
    proposer_memory,
)

# The metadata builder's shapes-only form: the config's bucket keys, no tensors.
SHAPES_ONLY = f"{ShapeMetadataBuilder.__module__}.{ShapeMetadataBuilder.__qualname__}"


class SimulatedClock(Clock, DeviceClock, Protocol):
    """The run's clock, which the device also advances by each step's predicted time."""


class PacedClock(WallClock):
    """A simulated device's clock in real time (the digital twin): each step's predicted
    time passes on the wall before the step's tokens go out."""

    def advance(self, seconds: float) -> None:
        time.sleep(seconds)

    def advance_to(self, t: float) -> None:
        self.sleep_until(t)


class SimulatedExecutor:
    needs_paddle = False
    predicts = True  # each step's time is the cost model's, on the device's clock

    def check(self, cfg: DictConfig) -> None:
        """Another executor's keys, a disaggregated deployment's pools; nothing else beyond
        the shared checks: a simulated device allocates no tensors and serves any
        precision; its hardware profile is checked as it is built; the engine predicted
        serves it there."""
        refuse_others_keys(cfg, Executor.simulated)
        check_disagg(cfg)
        check_engine(cfg)

    def server_num_blocks(self, cfg: DictConfig) -> int:
        """0: the pool is what the device's memory holds, known once it is built."""
        return 0

    def build(self, cfg: DictConfig, paced: bool = False) -> tuple[Engine, list[Request]]:
        if disaggregated(cfg):  # pipeline.disagg.deployment builds one
            raise ConfigError(
                f"disagg.prefill={cfg.disagg.prefill} disagg.decode={cfg.disagg.decode}: a "
                "server or a resumed folder runs one simulated instance; drop the disagg.* "
                "keys, or run the deployment afresh with python -m pipeline"
            )
        clock: SimulatedClock = PacedClock() if paced else VirtualClock()
        return build_simulated_engine(cfg, clock)


def build_simulated_engine(
    cfg: DictConfig, clock: SimulatedClock, hardware: HardwareProfile | None = None
) -> tuple[Engine, list[Request]]:
    """The real scheduler, KV-cache manager and metadata builder (shapes only) with a
    simulated device in place of the forward pass, on `clock`. `hardware`, when given,
    replaces the config's profile (a fit trying other figures)."""
    tokenizer = build(cfg.tokenizer)
    spec, _ = describe_model(cfg)
    check_model_context(cfg, spec)
    if cfg.hardware is None and hardware is None:
        raise ConfigError("executor=simulated needs a device: give hardware=gaudi3 (or ...)")
    hardware = hardware or build(cfg.hardware)
    workload, requests = load_workload(cfg, tokenizer)
    engine = simulated_engine(cfg, clock, spec, hardware, tokenizer, workload)
    return engine, requests


def parallel_of(cfg: DictConfig) -> ExpertParallel:
    """How the run spreads a MoE model's experts (ep, dp, imbalance, dispatch, skew) and
    how its dp replicas' steps spread."""
    dispatch = Dispatch(cfg.ep_dispatch)
    layout = ExpertParallel(cfg.ep, cfg.dp, cfg.ep_imbalance, dispatch, cfg.moe_routing_skew)
    spread = cfg.dp_step_spread
    return layout if spread is None else dataclasses.replace(layout, step_spread=spread)


def simulated_engine(
    cfg: DictConfig,
    clock: SimulatedClock,
    spec: ModelSpec,
    hardware: HardwareProfile,
    tokenizer: Tokenizer,
    workload: Workload,
) -> Engine:
    """One simulated instance of `cfg` (its tp, limits and pool) on `clock`, serving
    requests of `workload`: what build_simulated_engine builds once, and a disaggregated
    deployment once per instance."""
    speculation, draft = speculation_and_draft(cfg)
    hardware = engine_hardware(cfg, hardware)
    try:
        precision = Precision(cfg.quantization, cfg.kv_cache_dtype)
        parallel = parallel_of(cfg)
        check_layout(spec, cfg.tp, parallel)
        # The pool is what the device's memory leaves for KV blocks.
        num_blocks = cfg.num_blocks or kv_pool_blocks(
            spec, hardware, cfg.block_size, cfg.tp, precision, parallel
        )
        if speculation is not None and not cfg.num_blocks:  # the proposer's memory too
            num_blocks = speculative_pool(num_blocks, cfg, spec, precision, speculation, draft)
        split = cfg.executor.prefill_batch_split
        device = SimulatedDevice(spec, hardware, clock, cfg.tp, precision, split, parallel,
                                 speculation, draft, cfg.metadata.step_recipes,
                                 host_time(cfg))  # fmt: skip
    except ValueError as err:
        raise ConfigError(str(err)) from err
    kv_cache = KVCacheManager(num_blocks, cfg.block_size, cfg.prefix_caching)
    stop = StopRule((), cfg.max_model_len)  # output lengths come from the workload
    scheduler = build(cfg.scheduler, kv_cache=kv_cache, stop=stop, **speculative_steps(speculation))
    metadata = build(cfg.metadata, _target_=SHAPES_ONLY, kv_cache=kv_cache, pad_id=tokenizer.pad_id)
    # One token that ends nothing, whatever the step: what lets runs of steps be done at once.
    token = pick_token(tokenizer.eos_ids, tokenizer.vocab_size)
    return Engine(
        tokenizer=tokenizer,
        scheduler=scheduler,
        metadata=metadata,
        model=device,
        attention=NoAttention(),
        sampler=WorkloadLengthSampler(token),
        clock=clock,
        workload_counts=workload.counts,
        record_lengths=False,
        concurrency=workload.concurrency,
        simulation=DeviceSimulation(device, scheduler, metadata, token, speculation is None),
        fast_forward=workload_fast_forward,
    )


def speculative_pool(
    blocks: int,
    cfg: DictConfig,
    spec: ModelSpec,
    precision: Precision,
    speculation: Speculation,
    draft: ModelSpec | None,
) -> int:
    """The KV pool of `blocks` blocks less what the proposer holds: its weights, and its
    KV beside every token's."""
    weights, kv = proposer_memory(speculation, spec, draft, cfg.tp, precision)
    target_kv = spec.kv_bytes_per_token(cfg.tp) * precision.kv_bytes(spec.dtype_bytes)
    return pool_with_proposer(blocks, cfg.block_size, target_kv / spec.dtype_bytes, weights, kv)


def speculative_steps(speculation: Speculation | None) -> dict[str, Any]:
    """The scheduler's step formation under speculation: a decode row costs the budget its
    verification's k + 1 tokens, holds KV room for its k proposals, and gets the tokens
    the device's acceptance gives its n-th verification (nothing without speculation)."""
    if speculation is None:
        return {}
    k, expected = speculation.verified, speculation.expected_tokens
    if not 1.0 <= expected <= k + 1:
        raise ConfigError(f"{k} proposals cannot give {expected} tokens a step")
    return {
        "decode_tokens": 1 + k,  # a verification's tokens, counted in the step's budget
        "lookahead_slots": k,
        "accepted_tokens": functools.partial(accepted_extra, expected=expected),
    }


def simulated_device(engine: Engine) -> SimulatedDevice:
    """The device of an engine this executor built (its model stage)."""
    simulation = engine.simulation
    if not isinstance(simulation, DeviceSimulation):
        raise ValueError("the engine was not built by the simulated executor")
    return simulation.device
