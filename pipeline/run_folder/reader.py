"""Reading a run folder's files back, checked: the one reader that review, summary, resume
and buckets use. A file the pipeline did not write as it writes them (edited, cut short,
from another version) is a RunFileError naming the file, the line and the field, never a
traceback; a last line a kill or a full disk cut short is left out.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.run_folder.records import (
    GenerationRecord,
    StepRecord,
    check_field,
    json_kind,
    non_negative,
)
from pipeline.run_folder.run_files import RunFileError, open_no_link
from stages.checked_yaml import YamlFileError, read_yaml

GENERATIONS, STEPS, METRICS = "generations.jsonl", "steps.jsonl", "metrics.json"
RESOLVED_CONFIG = "resolved_config.yaml"
MAX_METRICS_BYTES = 64 * 1024 * 1024  # a trace run's metrics are a few kilobytes


class RunStatus(enum.StrEnum):
    """How a run ended: metrics.json's `status`."""

    OK = "ok"
    FAILED = "failed"  # an error stopped it; metrics.json's `error` says which
    INTERRUPTED = "interrupted"  # a signal stopped it; resume=FOLDER serves the rest
    STOPPED = "stopped"  # a capacity probe, stopped once its verdict was known


# ------------------------------------------------------------------------- YAML files


def read_yaml_file(path: Path) -> Any:
    try:
        return read_yaml(path, str(path))
    except YamlFileError as err:
        raise RunFileError(str(err)) from err


def config_path(folder: Path) -> Path | None:
    """The folder's composed config, Hydra's own copy first; None if it has neither."""
    for path in (folder / ".hydra" / "config.yaml", folder / RESOLVED_CONFIG):
        if path.is_file():
            return path
    return None


def read_mapping(path: Path) -> dict[str, Any]:
    """A YAML file that must hold a mapping (an empty file is an empty one)."""
    value = read_yaml_file(path)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise RunFileError(
            f"{path} does not hold a mapping of names to values: restore the file the run wrote"
        )
    return value


def read_overrides(folder: Path) -> list[str] | None:
    """.hydra/overrides.yaml: the command line's overrides; None if the file is absent."""
    path = folder / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    value = read_yaml_file(path)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
        raise RunFileError(
            f"{path} is not a list of overrides (`- key=value` lines): restore the file "
            "the run wrote"
        )
    return value


def read_choices(folder: Path) -> dict[str, str]:
    """The config group choices Hydra recorded (.hydra/hydra.yaml); {} without the file."""
    path = folder / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return {}
    node: Any = read_mapping(path)
    for key in ("hydra", "runtime", "choices"):
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return {}
    if not isinstance(node, dict):
        raise RunFileError(f"{path}: hydra.runtime.choices is not a mapping: restore the file")
    return {str(k): str(v) for k, v in node.items()}


# ------------------------------------------------------------------------- metrics.json


def read_metrics(folder: Path) -> dict[str, Any] | None:
    """metrics.json as an object; None if the folder has none."""
    path = folder / METRICS
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_METRICS_BYTES:
        raise RunFileError(f"{path} is larger than any metrics.json the pipeline writes")
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        problem = _one_line(err)
        raise RunFileError(f"{path} is not valid JSON ({problem}): serve the run again") from err
    if not isinstance(value, dict):
        raise RunFileError(
            f"{path} holds {json_kind(value)}, not the object of metrics the pipeline writes: "
            "serve the run again"
        )
    for key in ("status", "error"):
        if key in value and value[key] is not None and not isinstance(value[key], str):
            raise RunFileError(f"{path}: field `{key}` is not a string: serve the run again")
    if "duration_s" in value and value["duration_s"] is not None:
        check_field(value["duration_s"], non_negative, "a finite number >= 0", path, "duration_s")
    return value


# --------------------------------------------------------------------------- jsonl files


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, JSON value) of each line; a torn last line (no newline, not JSON) is
    left out; any other line that is not JSON is a RunFileError naming it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except (ValueError, RecursionError) as err:
                if not raw.endswith("\n"):  # the write a kill or a full disk interrupted
                    return
                raise RunFileError(
                    f"{path}:{number} is not valid JSON ({_one_line(err)}): remove the line"
                ) from err


def read_generations(path: Path) -> list[dict[str, Any]]:
    """generations.jsonl, each line checked; a line without `index` gets its position."""
    lines: list[dict[str, Any]] = []
    seen: dict[int, int] = {}
    for number, line in _lines(path):
        where = f"{path}:{number}"
        if isinstance(line, dict):
            line.setdefault("index", len(lines))
        GenerationRecord.check(line, where)
        if line["index"] in seen:
            raise RunFileError(
                f"{where}: index {line['index']} again (first on line {seen[line['index']]}): "
                "remove one of the two lines"
            )
        seen[line["index"]] = number
        lines.append(line)
    return lines


def read_step_lines(path: Path) -> list[dict[str, Any]]:
    """steps.jsonl, each line checked against the fields this version writes."""
    return [StepRecord.check(line, f"{path}:{number}") for number, line in _lines(path)]


def cut_torn_tail(path: Path) -> int:
    """Removes a last line the writer never finished (no newline, not JSON: a kill or a
    full disk), so that what is appended next starts a line of its own; returns the bytes
    removed. A last line that is whole JSON without its newline (the reader counts it) is
    kept, its newline added."""
    if not path.is_file():
        return 0
    with open_no_link(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        if _whole_json_tail(f, size):
            f.write(b"\n")
            return 0
        keep = size
        while keep > 0:  # back to the newline before the torn part, 64 KiB at a time
            start = max(0, keep - 65536)
            f.seek(start)
            newline = f.read(keep - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        f.truncate(keep)
        return size - keep


def _whole_json_tail(f: BinaryIO, size: int, limit: int = 64 * 1024 * 1024) -> bool:
    """Whether the file's last line (no newline after it) is complete JSON; the file is
    left positioned at its end. A line beyond `limit` bytes is taken as torn."""
    start = max(0, size - limit)
    f.seek(start)
    tail = f.read(size - start)
    newline = tail.rfind(b"\n")
    if newline < 0 and start > 0:
        return False
    try:
        json.loads(tail[newline + 1 :])
        whole = True
    except (ValueError, RecursionError):
        whole = False
    f.seek(size)
    return whole


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]
