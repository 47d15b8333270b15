"""The published checks' results, as files the plan's bands read (pipeline/plan/bands.py).

Each check of the simulator against published figures (`python -m benchmarks.published_moe`,
`published_disagg`, `published_speculative`) measures the error of one feature a
deployment may use. Run with `--record`, it writes what it measured to
pipeline/calibrate/data/published-checks/FEATURE.json: the median and worst absolute error
of its rows, how many, on which devices, the command and the date. Nothing else writes
these files, and no error is typed into them.

Features (`FEATURES`): `attention_dp` (dp > 1: attention replicas, experts split over them),
`expert_parallel` (ep > 1 at dp = 1), `disaggregation` (separate prefill and decode pools),
`speculative_<method>` (speculative decoding by that method).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.run_folder.run_files import output_folder, write_file

CHECKS_DIR = Path(__file__).resolve().parent / "data" / "published-checks"
FEATURES = (
    "attention_dp", "expert_parallel", "disaggregation", "speculative_mtp",
    "speculative_eagle", "speculative_ngram", "speculative_draft",
)  # fmt: skip


@dataclass(frozen=True)
class CheckResult:
    """What one check measured of one feature: relative errors' magnitudes over its rows."""

    feature: str
    median_error: float
    worst_error: float
    rows: int
    devices: list[str]
    command: str
    date: str
    source: str  # the published rows' file

    def describe(self) -> str:
        return (
            f"{self.feature}: median error {self.median_error:.0%} over {self.rows} published "
            f"rows ({', '.join(self.devices)}; {self.command}, {self.date})"
        )


def record(
    feature: str,
    errors: Sequence[float],
    devices: Sequence[str],
    source: str | Path,
    command: str,
    folder: Path = CHECKS_DIR,
) -> Path:
    """Writes one feature's result from the check's signed relative errors; returns the path."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature {feature!r}: one of {', '.join(FEATURES)}")
    magnitudes = [abs(e) for e in errors]
    result = CheckResult(
        feature=feature,
        median_error=round(statistics.median(magnitudes), 4),
        worst_error=round(max(magnitudes), 4),
        rows=len(magnitudes),
        devices=sorted(set(devices)),
        command=command,
        date=datetime.now(UTC).strftime("%Y-%m-%d"),
        source=Path(source).name,
    )
    path = output_folder(folder) / f"{feature}.json"
    return write_file(path, json.dumps(asdict(result), indent=2) + "\n")


def command_line(module: str, argv: Sequence[str]) -> str:
    """How the check was run: `python -m MODULE ARGS`."""
    return " ".join(["python -m", module, *argv])


def read_results(folder: Path = CHECKS_DIR) -> dict[str, CheckResult]:
    """Every recorded feature's result, by feature."""
    found: dict[str, CheckResult] = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        found[data["feature"]] = CheckResult(**data)
    return found
