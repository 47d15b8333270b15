"""Published rows simulated once, their steps' amounts kept to re-time for other figures.

A row whose requests are all there at the start runs the same schedule whatever the
device's speed, so a fit simulates each row once and then re-times its steps' FLOPs and
bytes (`Recorded.predicted`). Recording is the slow part (a 30,000-request row runs
thousands of steps), so `record(..., cache=DIR)` keeps each row's amounts in DIR, keyed on
the row, its composed config, the profile's figures that set the schedule (memory, not
speed) and the simulator's source: a refit re-times them without simulating again, and
any change to the code or the config simulates afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from pipeline.calibrate.published import REPO, PublishedRow, row_config, simulate_row
from pipeline.executors.build import build
from stages.simulator.cost_model import CostModel
from stages.simulator.hardware import HardwareProfile
from stages.simulator.precision import Precision
from stages.simulator.step_work import StepAmounts

# The code a recorded schedule and its amounts come from: any change records afresh. The
# cost model's file counts by what sets a step's amounts, not by how they are timed (a
# change of physics re-times the cached steps).
SOURCES = (
    "stages/simulator",
    "stages/scheduling/scheduler.py",
    "stages/scheduling/request_table.py",
    "stages/scheduling/run_updates.py",
    "stages/scheduling/lookahead.py",
    "stages/scheduling/kv_cache.py",
    "stages/forward/metadata.py",
    "stages/forward/forward_meta.py",
    "stages/forward/bucket_axes.py",
    "stages/forward/buckets.py",
    "stages/forward/step_shape.py",
    "stages/model/spec.py",
    "stages/scheduling/request.py",
    "pipeline/calibrate/published.py",
    "pipeline/job/engine.py",
    "pipeline/executors/build.py",
)
TIMING = REPO / "stages" / "simulator" / "cost_model.py"
AMOUNT_CODE = (
    CostModel.amounts,
    CostModel.amounts_of,
    CostModel._rows_amounts,
    CostModel._token_amounts,
    CostModel._sampled_amounts,
)
# Profile figures that decide the KV pool, and so the schedule; the speeds do not.
SCHEDULE_FIELDS = ("hbm_capacity_gib", "graph_memory_gib", "kv_headroom", "pads_to_buckets")
AMOUNT_FIELDS = tuple(f.name for f in dataclasses.fields(StepAmounts))


@dataclass
class Recorded:
    """A row's simulated steps, ready to re-time on other hardware figures."""

    row: PublishedRow
    cost: CostModel  # the model, tp, precision and batch split the row ran on
    amounts: StepAmounts  # stacked: one entry per step
    compiles: int
    output_tokens: int

    def predicted(self, hardware: HardwareProfile) -> float:
        """Output tokens per second on `hardware`."""
        seconds = float(np.sum(self.cost.on(hardware).seconds_of(self.amounts)))
        return self.output_tokens / (seconds + self.compiles * hardware.recompile_s)

    def error(self, hardware: HardwareProfile) -> float:
        """(predicted - published) / published on `hardware`."""
        return self.predicted(hardware) / self.row.value - 1


def recorded_run(row: PublishedRow, hardware: HardwareProfile | None) -> Recorded:
    """Simulates the row once, keeping its steps' amounts."""
    run = simulate_row(row, hardware, record=True)
    return Recorded(
        row=row,
        cost=run.cost,
        amounts=StepAmounts.stack([a for a, _ in run.steps]),
        compiles=sum(n for _, n in run.steps),
        output_tokens=run.output_tokens,
    )


def _source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        path = REPO / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            if file != TIMING:
                digest.update(str(file.relative_to(REPO)).encode())
                digest.update(file.read_bytes())
    for code in AMOUNT_CODE:
        digest.update(inspect.getsource(code).encode())
    return digest.hexdigest()


def cache_key(row: PublishedRow, hardware: HardwareProfile, source: str) -> str:
    """The row (not its published value), its config, the schedule's figures, the code."""
    config = OmegaConf.to_container(row_config(row, hardware), resolve=True)
    assert isinstance(config, dict)
    config.pop("hardware", None)  # its speeds are what a fit changes; its memory is below
    described = {
        "row": {k: v for k, v in dataclasses.asdict(row).items() if k != "value"},
        "config": config,
        "hardware": {k: getattr(hardware, k) for k in ("name", *SCHEDULE_FIELDS)},
        "amounts": AMOUNT_FIELDS,
        "source": source,
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _load(file: Path, row: PublishedRow, hardware: HardwareProfile) -> Recorded | None:
    try:
        with np.load(file) as data:
            amounts = StepAmounts(**{n: data[n] for n in AMOUNT_FIELDS})
            compiles, tokens = int(data["compiles"]), int(data["output_tokens"])
    except (OSError, KeyError, ValueError):
        return None  # unreadable or from another layout: simulate again
    cost = _cost_of(row, hardware)
    return Recorded(row, cost, amounts, compiles, tokens)


def _cost_of(row: PublishedRow, hardware: HardwareProfile) -> CostModel:
    """The row's cost model, as its simulated run builds it, without running it."""
    cfg = row_config(row, hardware)
    return CostModel(
        build(cfg.model),
        hardware,
        row.tp,
        precision=Precision(cfg.quantization, cfg.kv_cache_dtype),
        prefill_batch_split=cfg.executor.prefill_batch_split,
    )


def _save(file: Path, recorded: Recorded) -> None:
    arrays: dict[str, Any] = {n: np.asarray(getattr(recorded.amounts, n)) for n in AMOUNT_FIELDS}
    arrays |= {"compiles": recorded.compiles, "output_tokens": recorded.output_tokens}
    partial = file.with_name(file.name + ".partial.npz")
    np.savez(partial, **arrays)
    partial.replace(file)  # whole or absent, even if interrupted


def record(
    rows: Sequence[PublishedRow],
    hardware: HardwareProfile | dict[str, HardwareProfile] | None,
    cache: str | Path | None = None,
) -> list[Recorded]:
    """Each row simulated once (or read from `cache`) on its device's profile: `hardware`
    maps device names to profiles, is one profile for every row, or None for the
    config's."""
    source = _source_digest() if cache else ""
    folder = Path(cache) if cache else None
    if folder:
        folder.mkdir(parents=True, exist_ok=True)
    recorded = []
    for row in rows:
        profile = hardware.get(row.hardware) if isinstance(hardware, dict) else hardware
        if folder is None:
            recorded.append(recorded_run(row, profile))
            continue
        start = profile or build(row_config(row).hardware)
        file = folder / f"{cache_key(row, start, source)}.npz"
        found = _load(file, row, start) if file.is_file() else None
        if found is None:
            found = recorded_run(row, start)
            _save(file, found)
        recorded.append(found)
    return recorded
