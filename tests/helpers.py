"""What the tests share: compose the real config (Hydra's compose API), serve it in-process,
and run a command as a user types it. Tests import these from here, never from conftest."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from pipeline.config.compose import compose_config
from pipeline.executors import build_engine
from pipeline.schema import (
    Executor,
    PipelineConf,
    SpecModelConf,
    TraceWorkloadConf,
    device_default,
    schema_defaults,
)
from stages.forward.buckets import Bucketing
from stages.model.spec import ModelSpec
from stages.model.spec_option import model_spec
from stages.scheduling.chunk_policy import Budget
from stages.scheduling.request import Request
from stages.trace import TraceWorkload

# One Paddle math thread for a real run: `pytest -n auto` runs a test per core already, and
# threads of two tests on one core cost more than they give. How fast, not which tokens; the
# Paddle executor's key, which a simulated run refuses.
ONE_THREAD = "num_threads=1"

# Small enough for seconds per run, long enough that prompts span several blocks and chunks.
LIMITS = ["block_size=16", "max_model_len=256", "max_num_seqs=8"]
SMALL = [
    *LIMITS,
    "workload.num_requests=6",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=120",
    "workload.min_new_tokens=3",
    "workload.max_new_tokens=10",
]

# For command-line runs: a few short requests, well under a second a job once Paddle is loaded
# (TINY_RUN for any executor, TINY for a real one).
TINY_RUN = [
    "block_size=16",
    "max_num_seqs=4",
    "max_model_len=256",
    "workload.num_requests=3",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=60",
    "workload.min_new_tokens=3",
    "workload.max_new_tokens=6",
]
TINY = [ONE_THREAD, *TINY_RUN]


REPO = Path(__file__).resolve().parents[1]


def run_cli(cwd: Path, module: str, *args: object) -> subprocess.CompletedProcess:
    """`python -m module args` in a fresh process, as a user types it (HYDRA_FULL_ERROR unset)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


DEVICE_ENUMS = {"budget": Budget, "bucketing": Bucketing}


def schema_kwargs(conf: type, **given: Any) -> dict[str, Any]:
    """A stage's keyword arguments with the values pipeline/schema/ gives them by default
    (a top-level key's interpolation, such as ${seed}, as the top level's default; its
    `_target_` and required fields left out), `given` on top: a stage built directly gets
    the same defaults as one the config builds."""
    top = {f.name: f.default for f in dataclasses.fields(PipelineConf)}
    values = {}
    for f in dataclasses.fields(conf):
        if isinstance(f.default, str) and f.default.startswith("${"):
            inner = f.default[2:-1]
            if inner.startswith("device_default:"):  # no device: a padding device's default
                key = inner.split(":", 1)[1].split(",", 1)[0]
                values[f.name] = DEVICE_ENUMS[key](device_default(key, True))
            elif inner.startswith("oc.select:"):  # an engine profile's key: its fallback
                fallback = inner.rsplit(",", 1)[1]
                known = {"false": False, "true": True}
                values[f.name] = (
                    int(fallback) if fallback.isdigit() else known.get(fallback, fallback)
                )
            else:
                values[f.name] = top[inner]
    for name, value in schema_defaults(conf).items():
        values[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return {**values, **given}


def spec_of(**given: Any) -> ModelSpec:
    """A model=spec description with the schema's defaults and `given` on top."""
    return model_spec(**schema_kwargs(SpecModelConf, **given))


def trace_workload(path: str | Path, **given: Any) -> TraceWorkload:
    """A trace workload with the schema's defaults and `given` on top."""
    return TraceWorkload(**schema_kwargs(TraceWorkloadConf, path=str(path), **given))


@functools.lru_cache(maxsize=64)
def composed(overrides: tuple[str, ...]) -> DictConfig:
    """Hydra's composition of `overrides`, once a process: several tests compose the same."""
    return compose_config(overrides)


def make_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The small defaults, with the synthetic workload's keys only when it is the workload.
    Each call gets its own copy, which the test may change."""
    base = LIMITS if any(o.startswith("workload=") for o in overrides) else SMALL
    cfg = composed((*base, *overrides))
    if cfg.executor.name == Executor.paddle:  # one math thread, unless the test sets them
        cfg = composed((*base, ONE_THREAD, *overrides))
    return copy.deepcopy(cfg)


class RecordingSampler:
    """Wraps a sampler and keeps, per request, the logits row behind each kept output token."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.logits: dict[tuple[str, int], np.ndarray] = {}

    def validate_request(self, request: Request) -> str | None:
        return self.inner.validate_request(request)

    def sample(self, logits, requests):
        rows = logits.numpy()
        for row, request in zip(rows, requests, strict=True):
            # A non-final chunk's row is overwritten by the final chunk's later on.
            self.logits[(request.id, len(request.output_ids))] = row
        return self.inner.sample(logits, requests)


def serve(overrides: Sequence[str] = (), record_logits: bool = False, steps: list | None = None):
    """Runs a composed pipeline to the end; returns (requests by id, engine).

    `steps`, when given, receives the engine's StepRecord of every step."""
    cfg = make_config(overrides)
    engine, requests = build_engine(cfg)
    if cfg.warmup:
        engine.warmup()  # padding-only steps first: they must leave no trace in the outputs
    if record_logits:
        engine.sampler = RecordingSampler(engine.sampler)
    engine.run(requests, on_step=steps.append if steps is not None else lambda record: None)
    return {r.id: r for r in requests}, engine


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text`, each by its column's header, so a
    test names the column it checks and a new column moves nothing it asserts."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if len(lines) < 2:
        return []

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split(" | ")]

    header = cells(lines[0])
    return [dict(zip(header, cells(line), strict=True)) for line in lines[2:]]
