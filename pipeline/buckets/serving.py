"""A planned bucket set served on the simulated device: the misses a report shows are
measured, not estimated from the recorded steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.run_folder import read_metrics

# Overrides a served check sets itself: the device, warmup, and the buckets under test.
_OWN_KEYS = ("executor=", "warmup=", "hydra.", "+buckets=", "buckets=", "resume=", "+resume=")


@dataclass
class Served:
    """One serving of a plan: which workload, and what the run measured."""

    label: str
    overrides: list[str]
    folder: Path
    bucket_misses: int
    serving_compiles: int
    token_utilization: float
    warmup_shapes: int


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


def serve_plan(variants: list[tuple[str, list[str]]], plan_dir: Path, name: str) -> list[Served]:
    """Each (label, overrides) served on the simulated device with the planned set
    `plan_dir/buckets/name.yaml`, warmed, into plan_dir/served-LABEL."""
    from pipeline.compose import compose_config
    from pipeline.run import run

    results = []
    for label, overrides in variants:
        folder = plan_dir / f"served-{label}"
        composed = [
            *simulated(overrides),
            f"hydra.searchpath=[file://{plan_dir.resolve()}]",
            f"+buckets={name}",
        ]
        folder.mkdir(parents=True, exist_ok=True)
        run(compose_config(composed), folder)
        metrics = read_metrics(folder) or {}
        results.append(
            Served(
                label=label,
                overrides=simulated(overrides),
                folder=folder,
                bucket_misses=int(metrics.get("bucket_misses", 0)),
                serving_compiles=int(metrics.get("serving_compiles", 0)),
                token_utilization=float(metrics.get("token_utilization", 0.0)),
                warmup_shapes=int(metrics.get("warmup_shapes", 0)),
            )
        )
    return results
