"""Resuming a run folder: `python -m pipeline +resume=RUN_DIR` serves the requests the folder
has no finished generation for, with the folder's own config, and completes the folder.

Greedy tokens depend only on a request's own prompt, so the resumed requests get the tokens
an uninterrupted run would have given them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.run_folder import artefacts, reader
from pipeline.run_folder.former_names import rename_targets
from pipeline.run_folder.identity import TOKEN_NEUTRAL, check_identity
from pipeline.run_folder.records import StepRecord
from stages.scheduling.request import FinishReason, Request, Status

log = structlog.get_logger(__name__)


@dataclass
class Previous:
    """What an earlier run left in its folder."""

    folder: Path
    cfg: DictConfig
    kept: dict[int, dict[str, Any]]  # finished generation lines by workload index
    steps: list[StepRecord] = field(default_factory=list)
    duration_s: float = 0.0


def _config(folder: Path) -> tuple[DictConfig, dict[str, str]]:
    """The folder's composed config (Hydra's own copy first) and its group choices."""
    cfg = artefacts.read_run_config(folder)
    if cfg is None:
        raise ConfigError(f"resume={folder} is not a run folder: it has no .hydra/config.yaml")
    rename_targets(cfg)  # a folder written by an earlier release
    choices = reader.read_choices(folder)
    if choices.get("hydra/help") == "serve":  # conf/serve.yaml's own help
        raise ConfigError(
            f"resume={folder} is a server's folder (python -m pipeline.serve): its requests "
            "came over HTTP, not from a workload, so none can be served again; start the "
            "server again instead"
        )
    return cfg, choices


def apply_overrides(cfg: DictConfig, choices: dict[str, str], overrides: Sequence[str]) -> None:
    """Token-neutral overrides are applied; any other that changes a value is refused."""
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key == "resume":
            continue
        value = override.value()
        if key in TOKEN_NEUTRAL:
            OmegaConf.update(cfg, key, value, force_add=True)
            continue
        old = choices[key] if key in choices else OmegaConf.select(cfg, key, default=None)
        if isinstance(old, DictConfig):
            old = OmegaConf.to_container(old, resolve=True)
        if str(old) != str(value):
            raise ConfigError(
                f"resume: {override.input_line} changes {key} (the run has {old!r}), which can "
                f"change the tokens; resume with the run's own config (only "
                f"{', '.join(sorted(TOKEN_NEUTRAL))} may change)"
            )


def appendable(path: Path) -> Path:
    """`path` ready for the resumed run's lines: a last line the writer never ended is
    ended (complete JSON, kept) or cut (torn by a kill or a full disk), so that the next
    line does not continue it. Called once the folder has passed every check: a folder
    that is refused is left as it was."""
    removed = reader.cut_torn_tail(path)
    if removed:
        log.warning("torn_line_cut", file=str(path), bytes=removed)
        print(f"resume: {path} ended mid-line; cut its last {removed} bytes", flush=True)
    return path


def load_previous(folder: str | Path, overrides: Sequence[str] = ()) -> Previous:
    """The folder's config, finished lines and steps; ConfigError (one line naming the file
    and field) for a folder that cannot be resumed as it is."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"resume={folder}: no such folder")
    try:
        return _load(folder, overrides)
    except reader.RunFileError as err:
        raise ConfigError(f"resume: {err}") from err


def _load(folder: Path, overrides: Sequence[str]) -> Previous:
    cfg, choices = _config(folder)
    apply_overrides(cfg, choices, overrides)
    kept: dict[int, dict[str, Any]] = {}
    generations = folder / artefacts.GENERATIONS
    if generations.is_file():
        for line in reader.read_generations(generations):
            if line.get("error") != artefacts.INTERRUPTED:
                kept[line["index"]] = line
    check_identity(cfg, folder, len(kept))
    steps_file = folder / artefacts.STEPS
    step_lines = reader.read_step_lines(steps_file) if steps_file.is_file() else []
    steps = [StepRecord.from_line(line) for line in step_lines]
    duration = sum(s.duration_s for s in steps)
    metrics = reader.read_metrics(folder) if (folder / artefacts.METRICS).is_file() else None
    if metrics and metrics.get("duration_s") is not None:
        duration = float(metrics["duration_s"])
    return Previous(folder, cfg, kept, steps, duration)


def restore(request: Request, line: dict[str, Any]) -> None:
    """A finished request as the earlier run left it, times shifted to its own arrival."""
    request.output_ids = [int(t) for t in line.get("output_ids") or []]
    reason = line.get("finish_reason")
    request.finish_reason = FinishReason(reason) if reason is not None else None
    request.error = line.get("error")
    request.status = Status.FINISHED
    ttft, e2e = line.get("ttft_s"), line.get("e2e_s")
    if ttft is not None:
        gaps = np.cumsum([0.0, *(line.get("itl_s") or [])])
        request.token_times = (request.arrival_s + ttft + gaps).tolist()
    request.finish_s = request.arrival_s + (e2e if e2e is not None else 0.0)
    request.logprobs = [{int(k): v for k, v in e.items()} for e in line.get("logprobs") or []]


def pending_requests(requests: Sequence[Request], previous: Previous) -> list[Request]:
    """Restores every request the folder finished; returns the others, to be served."""
    by_index = {r.index: r for r in requests}
    for index, line in previous.kept.items():
        request = by_index.get(index)
        if request is None or request.id != line.get("id") or request.prompt != line.get("prompt"):
            raise ConfigError(
                f"resume: request {line.get('id')!r} (workload index {index}) of "
                f"{previous.folder} is not in the workload any more: its file or seed changed"
            )
        restore(request, line)
    return [r for r in requests if r.index not in previous.kept]
