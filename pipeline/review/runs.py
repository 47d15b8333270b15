"""Run folders as the review reads them: the checked readers, one-line errors, and what
makes two runs' requests the same requests."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.run_folder.reader import (
    RunFileError,
    RunStatus,
    read_choices,
    read_generations,
    read_mapping,
    read_metrics,
    read_overrides,
)


class ReviewError(Exception):
    """Input the review cannot work with; the message is the one line the user sees."""


@dataclass
class Run:
    """A run folder's files, as the review reads them."""

    path: Path
    config: dict[str, Any]
    choices: dict[str, str]
    overrides: list[str] | None
    metrics: dict[str, Any]
    generations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every request of the workload has its line (a run that ended normally)."""
        return self.metrics.get("status") == RunStatus.OK


def request_key(line: dict[str, Any]) -> dict[str, Any]:
    """What makes a request the same request in two runs: its prompt and its limit."""
    return {"prompt": line.get("prompt"), "max_new_tokens": line.get("max_new_tokens")}


def workload_digest(generations: Sequence[dict[str, Any]]) -> str:
    """A hash of the requests served (ids, prompts, limits), whatever file they came from."""
    keyed = sorted((str(g.get("id")), request_key(g)) for g in generations)
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()


def load_run(path: Path) -> Run:
    """Reads a run folder with the checked readers; ReviewError names the folder, the file
    and, for a file that is not as the pipeline writes it, the line and field."""
    path = Path(path)
    if not path.is_dir():
        raise ReviewError(f"{path}: no such folder")
    if not (path / "resolved_config.yaml").is_file():
        raise ReviewError(f"{path} is not a run folder: it has no resolved_config.yaml")
    try:
        return _read_run(path)
    except RunFileError as err:
        raise ReviewError(str(err)) from err


def _read_run(path: Path) -> Run:
    config = read_mapping(path / "resolved_config.yaml")
    # Schema and Hydra-internal groups say nothing about the pipeline itself.
    choices = {
        k: v for k, v in read_choices(path).items() if not k.startswith(("schema/", "hydra/"))
    }
    overrides = read_overrides(path)
    # A folder without metrics.json is a run that was killed before it could write one.
    metrics = read_metrics(path)
    generations_path = path / "generations.jsonl"
    if not generations_path.is_file():
        why = f" (its metrics.json says {metrics.get('status')}" if metrics is not None else ""
        if why and metrics and metrics.get("error"):
            why += ": " + " ".join(str(metrics["error"]).split())  # one line on stderr
        raise ReviewError(f"{path} has no generations.jsonl{why + ')' if why else ''}")
    metrics = {"status": RunStatus.INTERRUPTED} if metrics is None else metrics
    generations = read_generations(generations_path)
    ids = Counter(g["id"] for g in generations)
    repeated = next((rid for rid, count in ids.items() if count > 1), None)
    if repeated is not None:
        raise ReviewError(
            f"{generations_path}: id {repeated!r} is on {ids[repeated]} lines, and the review "
            "matches requests by id: serve the run again (this version gives every request "
            "its own id)"
        )
    return Run(path, config, choices, overrides, metrics, generations)
