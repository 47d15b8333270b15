"""Speculative acceptance from a published table: `speculative.acceptance_from=published:DATASET`.

pipeline/calibrate/data/published-speculative.csv holds, per model preset, method, k and
dataset, the per-position acceptance and proposal rate a study measured (each row with its
source and how the figures were derived: benchmarks.spec_acceptance on the study's own
traces). A configuration naming `published:DATASET` takes that row's acceptance and
proposal rate in place of its own `speculative.acceptance` / `speculative.proposal_rate`.
"""

from __future__ import annotations

import csv
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

TABLE = Path(__file__).resolve().parents[1] / "calibrate/data/published-speculative.csv"
PUBLISHED = "published:"


@dataclass(frozen=True)
class PublishedAcceptance:
    acceptance: tuple[float, ...]
    proposal_rate: float
    source: str  # the study, the dataset and how the figures were derived


def preset_name(preset: str) -> str:
    """The `name` of conf/model/spec/PRESET.yaml ("" where there is none)."""
    path = importlib.resources.files("pipeline.conf") / "model" / "spec" / f"{preset}.yaml"
    if not path.is_file():
        return ""
    values = OmegaConf.to_container(OmegaConf.create(path.read_text(encoding="utf-8")))
    return str(values.get("name") or "") if isinstance(values, dict) else ""


def published_acceptance(
    model_name: str, method: str, tokens: int, dataset: str, table: Path = TABLE
) -> PublishedAcceptance:
    """The table's row for the model (its `name`), method, k and dataset; ValueError naming
    what the table has for that model and method where none matches."""
    with open(table, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == method]
    mine = [r for r in rows if preset_name(r["model_preset"]) == model_name]
    found = [r for r in mine if int(r["tokens"]) == tokens and r["dataset"] == dataset]
    if not found:
        have = sorted({f"{r['dataset']} (k={r['tokens']})" for r in mine}) or ["none"]
        raise ValueError(
            f"speculative.acceptance_from={PUBLISHED}{dataset}: {table.name} has no "
            f"{method} row for {model_name or 'this model'} at speculative.tokens={tokens}; "
            f"it has: {', '.join(have)}"
        )
    row = found[0]
    source = (
        f"{row['source']}: {row['proposer']} on {row['dataset']}, {row['model_preset']} "
        f"k={row['tokens']} ({row['acceptance_from']})"
    )
    return PublishedAcceptance(
        tuple(float(v) for v in json.loads(row["acceptance"])),
        float(row.get("proposal_rate") or 1.0),
        source,
    )
