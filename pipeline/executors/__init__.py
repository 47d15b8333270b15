"""Executors: what runs a step's forward, chosen by `executor.name` here and nowhere else.

Each executor builds its own engine (its model or device stage, its KV pool's default size,
its clock), says whether it needs Paddle, and checks what only it refuses. The stages above
the forward (scheduler, KV-cache manager, metadata builder) are the same code for all of
them. A new executor (a real Gaudi one) is a class with this interface and a line in
`EXECUTORS`.
"""

from __future__ import annotations

from typing import Protocol

from omegaconf import DictConfig, OmegaConf

from pipeline.config.added_keys import check_added_keys
from pipeline.config.checks import check_common
from pipeline.executors.build import check_resolves
from pipeline.executors.paddle import PaddleExecutor
from pipeline.executors.simulated import SimulatedExecutor
from pipeline.job.engine import Engine
from pipeline.schema import Executor
from stages.scheduling.request import Request


class EngineExecutor(Protocol):
    # Paddle is loaded before the engine is built (and before a server installs its own
    # signal handlers, which loading Paddle would replace).
    needs_paddle: bool
    # Its steps' times are predicted (a cost model on a virtual clock), not measured: what
    # a capacity search needs, and what a calibration cannot fit.
    predicts: bool

    def check(self, cfg: DictConfig) -> None:
        """What this executor alone refuses; one-line ConfigErrors."""

    def server_num_blocks(self, cfg: DictConfig) -> int:
        """A server's KV pool when num_blocks is not given (a server has no workload to
        size it by); 0: the build sizes it itself."""

    def build(self, cfg: DictConfig, paced: bool = False) -> tuple[Engine, list[Request]]:
        """The engine and the workload's requests. paced: the run's clock is the wall's
        (a server), where the executor's own would be virtual."""


EXECUTORS: dict[Executor, EngineExecutor] = {
    Executor.paddle: PaddleExecutor(),
    Executor.simulated: SimulatedExecutor(),
}


def executor_of(cfg: DictConfig) -> EngineExecutor:
    """The config's executor; a run folder's config written before executors were named
    ran the Paddle one."""
    return EXECUTORS[Executor(OmegaConf.select(cfg, "executor.name", default=Executor.paddle))]


def check_config(cfg: DictConfig) -> EngineExecutor:
    """Every check a config must pass before anything is built: the shared ones, then the
    executor's own; returns the executor."""
    executor = executor_of(cfg)
    check_common(cfg)
    check_added_keys(cfg)  # +scheduler.block_size=8: a key the stage would fail on
    executor.check(cfg)
    return executor


def build_engine(cfg: DictConfig, paced: bool = False) -> tuple[Engine, list[Request]]:
    """Checks the config, builds every stage and loads the workload. paced: a simulated
    device's clock in real time (a server's digital twin); a run's is virtual."""
    check_resolves(cfg)
    return check_config(cfg).build(cfg, paced)
