"""A planned bucket set served on the simulated device: the misses a report shows are
measured, not estimated from the recorded steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.config.executor_keys import owned_keys
from pipeline.run_folder.reader import read_metrics
from pipeline.schema import Executor

# Overrides a served check sets itself: the device, warmup, and the buckets under test; and
# a real run's own keys (its threads), which the simulated device refuses.
_OWN_KEYS = (
    "executor=",
    "warmup=",
    "hydra.",
    "+buckets=",
    "buckets=",
    "resume=",
    "+resume=",
    *(f"{key.name}=" for key in owned_keys(Executor.paddle)),
)


@dataclass
class Served:
    """One serving of a bucket set: which workload, and what the run measured."""

    label: str
    overrides: list[str]
    folder: Path
    bucket_misses: int
    serving_compiles: int
    token_utilization: float
    warmup_shapes: int
    duration_s: float = 0.0
    throughput: float = 0.0  # output tokens/s
    ttft_ms: tuple[float, float] = (0.0, 0.0)  # p50, p90
    tpot_ms: tuple[float, float] = (0.0, 0.0)
    warmup_s: float = 0.0

    @classmethod
    def read(cls, label: str, overrides: list[str], folder: Path) -> Served:
        m = read_metrics(folder) or {}

        def pair(key: str) -> tuple[float, float]:
            stats = m.get(key) or {}
            return float(stats.get("p50") or 0.0), float(stats.get("p90") or 0.0)

        return cls(
            label=label,
            overrides=overrides,
            folder=folder,
            bucket_misses=int(m.get("bucket_misses", 0)),
            serving_compiles=int(m.get("serving_compiles", 0)),
            token_utilization=float(m.get("token_utilization", 0.0)),
            warmup_shapes=int(m.get("warmup_shapes", 0)),
            duration_s=float(m.get("duration_s", 0.0)),
            throughput=float(m.get("output_throughput", 0.0)),
            ttft_ms=pair("ttft_ms"),
            tpot_ms=pair("tpot_ms"),
            warmup_s=float(m.get("predicted_warmup_s") or m.get("warmup_s") or 0.0),
        )


def run_overrides(run: Path) -> list[str] | None:
    """The command-line overrides a run folder was made with (Hydra's overrides.yaml), or
    None when the folder keeps none."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    return [str(o) for o in yaml.safe_load(path.read_text(encoding="utf-8")) or []]


def workload_overrides(overrides: list[str]) -> list[str]:
    """The overrides that describe the workload and limits, without the ones a check sets
    (device, warmup, buckets, run folder) or explicit bucket axes a plan replaces."""
    return [
        o
        for o in overrides
        if not o.startswith(_OWN_KEYS) and not o.startswith(("metadata.", "+metadata."))
    ]


def with_seed(overrides: list[str], seed: int) -> list[str]:
    return [*(o for o in overrides if not o.startswith("seed=")), f"seed={seed}"]


def simulated(overrides: list[str]) -> list[str]:
    """The simulated device (Gaudi 3 unless a hardware is given) warmed before serving."""
    device = [] if any(o.startswith("hardware=") for o in overrides) else ["hardware=gaudi3"]
    return ["executor=simulated", *device, *workload_overrides(overrides), "warmup=true"]


def serve_set(overrides: list[str], chosen: list[str], folder: Path, label: str) -> Served:
    """The workload `overrides` served, warmed, on the simulated device with the bucket set
    the `chosen` overrides select, into `folder`."""
    from pipeline.config.compose import compose_config
    from pipeline.job.run import run

    folder.mkdir(parents=True, exist_ok=True)
    run(compose_config([*simulated(overrides), *chosen]), folder)
    return Served.read(label, simulated(overrides), folder)


def planned_set(plan_dir: Path, name: str) -> list[str]:
    """The overrides that select the bucket file plan_dir/buckets/name.yaml."""
    return [f"hydra.searchpath=[file://{plan_dir.resolve()}]", f"+buckets={name}"]


def serve_plan(variants: list[tuple[str, list[str]]], plan_dir: Path, name: str) -> list[Served]:
    """Each (label, overrides) served on the simulated device with the planned set
    `plan_dir/buckets/name.yaml`, warmed, into plan_dir/served-LABEL."""
    chosen = planned_set(plan_dir, name)
    return [
        serve_set(overrides, chosen, plan_dir / f"served-{label}", label)
        for label, overrides in variants
    ]
