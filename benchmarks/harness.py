"""Serves a composed config through the real pipeline and times each stage of every step.

The stages' methods are wrapped in timers on the built engine (nothing in the engine
changes), so a step's wall time splits into schedule, metadata build, model forward
(attention included), sample, update and the rest of the loop.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.floor import matmul_rate, run_flops
from pipeline.config.compose import compose_config
from pipeline.executors import build_engine
from pipeline.job.metrics import summarise
from pipeline.run_folder.records import StepRecord
from stages.scheduling.request import Request

# (name in the report, engine attribute, method): the calls one step makes.
TIMED_STAGES = (
    ("schedule", "scheduler", "schedule"),
    ("metadata", "metadata", "build"),
    ("forward", "model", "forward"),
    ("sample", "sampler", "sample"),
    ("update", "scheduler", "update"),
    ("release", "attention", "release"),
)
# Calls inside the model forward, shown as parts of it: attention with its output projection.
INNER_STAGES = (
    ("forward: qkv_rope", "attention", "qkv_rope"),
    ("forward: attention", "attention", "attend"),
)


def synthetic_overrides(
    requests: int, min_prompt: int, max_prompt: int, new_tokens: int, threads: int
) -> list[str]:
    """model=small serving `requests` synthetic prompts, each asking for `new_tokens`."""
    return [
        "model=small",
        f"num_threads={threads}",
        f"max_num_seqs={requests}",
        f"max_model_len={max_prompt + new_tokens}",
        f"workload.num_requests={requests}",
        f"workload.min_prompt_tokens={min_prompt}",
        f"workload.max_prompt_tokens={max_prompt}",
        f"workload.min_new_tokens={new_tokens}",
        f"workload.max_new_tokens={new_tokens}",
        "workload.ignore_eos=true",
    ]


@dataclass
class TimedStep:
    record: StepRecord
    stages_s: dict[str, float]

    @property
    def other_s(self) -> float:
        """Loop time outside the timed stages: arrivals, plan checks, the step record."""
        top = {name for name, _, _ in TIMED_STAGES}
        return self.record.duration_s - sum(v for k, v in self.stages_s.items() if k in top)


@dataclass
class ServedRun:
    overrides: list[str]
    metrics: dict[str, Any]
    steps: list[TimedStep]
    requests: list[Request]
    flops: int
    matmul_rate: float  # FLOP/s: the higher of the rates measured just before and after
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def floor_s(self) -> float:
        return self.flops / self.matmul_rate

    @property
    def floor_fraction(self) -> float:
        """The floor over the run's wall time: 1.0 would be matmul-bound at the measured rate."""
        return self.floor_s / self.metrics["duration_s"]

    def overhead(self, min_decodes: int) -> dict[str, float] | None:
        """Mean seconds per stage over the decode-only steps with at least `min_decodes`
        running requests, with `step` the mean step time; None if there are none."""
        chosen = [
            s
            for s in self.steps
            if s.record.mode == "decode" and len(s.record.decode) >= min_decodes
        ]
        if not chosen:
            return None
        mean: dict[str, float] = defaultdict(float)
        for s in chosen:
            for name, seconds in s.stages_s.items():
                mean[name] += seconds / len(chosen)
            mean["other"] += s.other_s / len(chosen)
            mean["step"] += s.record.duration_s / len(chosen)
        mean["steps"] = len(chosen)
        return dict(mean)


def _timed(method: Callable, name: str, totals: dict[str, float]) -> Callable:
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    return wrapper


def serve(overrides: Sequence[str]) -> ServedRun:
    """Builds the pipeline for `overrides`, serves the workload, and measures the matmul
    rate just before and just after: on a shared machine the higher one is closer to what
    the machine can do, so the floor it gives is the stricter."""
    cfg = compose_config(overrides)
    engine, requests = build_engine(cfg)
    rate_before = matmul_rate(cfg.num_threads, engine.model.spec)
    current: dict[str, float] = defaultdict(float)
    for name, attr, method in TIMED_STAGES + INNER_STAGES:
        stage = getattr(engine, attr)
        if hasattr(stage, method):
            setattr(stage, method, _timed(getattr(stage, method), name, current))
    steps: list[TimedStep] = []

    def on_step(record: StepRecord) -> None:
        steps.append(TimedStep(record, dict(current)))
        current.clear()

    duration = engine.run(requests, on_step=on_step)
    rate = max(rate_before, matmul_rate(cfg.num_threads, engine.model.spec))
    metrics = summarise(requests, [s.record for s in steps], duration)
    served = [r for r in requests if r.finish_reason != "error"]
    flops = run_flops(
        engine.model.spec, [len(r.prompt_ids) for r in served], [len(r.output_ids) for r in served]
    )
    return ServedRun(list(overrides), metrics, steps, requests, flops, rate, {"engine": engine})
