"""Reading a run folder's files back, checked: the one reader that review, summary, resume
and buckets use. A file the pipeline did not write as it writes them (edited, cut short,
from another version) is a RunFileError naming the file, the line and the field, never a
traceback; a last line a kill or a full disk cut short is left out.
"""

from __future__ import annotations

import enum
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from pipeline.checks import ConfigError
from pipeline.run_files import open_no_link
from stages.checked_yaml import YamlFileError, read_yaml
from stages.scheduling.request import FinishReason, StepMode

GENERATIONS, STEPS, METRICS = "generations.jsonl", "steps.jsonl", "metrics.json"
RESOLVED_CONFIG = "resolved_config.yaml"
MAX_METRICS_BYTES = 64 * 1024 * 1024  # a trace run's metrics are a few kilobytes


class RunStatus(enum.StrEnum):
    """How a run ended: metrics.json's `status`."""

    OK = "ok"
    FAILED = "failed"  # an error stopped it; metrics.json's `error` says which
    INTERRUPTED = "interrupted"  # a signal stopped it; resume=FOLDER serves the rest
    STOPPED = "stopped"  # a capacity probe, stopped once its verdict was known


class RunFileError(ConfigError):
    """A run-folder file that cannot be read; the message is the one line the user sees."""


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
            f"{path} holds {_kind(value)}, not the object of metrics the pipeline writes: "
            "serve the run again"
        )
    for key in ("status", "error"):
        if key in value and value[key] is not None and not isinstance(value[key], str):
            raise RunFileError(f"{path}: field `{key}` is not a string: serve the run again")
    if "duration_s" in value and value["duration_s"] is not None:
        _check(value["duration_s"], _non_negative, "a finite number >= 0", path, "duration_s")
    return value


# --------------------------------------------------------------------------- jsonl files


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _int(value) and value >= 0


def _non_negative(value: Any) -> bool:
    return (_int(value) or isinstance(value, float)) and math.isfinite(value) and value >= 0


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _one_of(kind: type[enum.StrEnum]) -> Callable[[Any], bool]:
    values = frozenset(member.value for member in kind)
    return lambda value: isinstance(value, str) and value in values


def _choices(kind: type[enum.StrEnum]) -> str:
    return "one of " + ", ".join(member.value for member in kind)


def _chunk(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _str(value.get("id"))
        and all(_count(value.get(k)) for k in ("start", "end", "cached"))
    )


def _logprob_entry(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    )


# field -> (check, what it must be). Fields beyond these are kept as they are.
GENERATION_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (_str, "a string"),
    "index": (_count, "an integer >= 0"),
    "prompt": (_optional(_str), "a string"),
    "prompt_tokens": (_optional(_count), "an integer >= 0"),
    "max_new_tokens": (_optional(_int), "an integer"),
    "cached_tokens": (_optional(_count), "an integer >= 0"),
    "output_ids": (_list_of(_count), "a list of token ids (integers >= 0)"),
    "output_text": (_optional(_str), "a string"),
    "finish_reason": (_optional(_one_of(FinishReason)), f"{_choices(FinishReason)} or null"),
    "error": (_optional(_str), "a string or null"),
    "ttft_s": (_optional(_non_negative), "a finite number >= 0 or null"),
    "e2e_s": (_optional(_non_negative), "a finite number >= 0 or null"),
    "itl_s": (_optional(_list_of(_non_negative)), "a list of finite numbers >= 0"),
    "logprobs": (_list_of(_logprob_entry), "a list of {token id: log-probability}"),
}


def _part_dims(value: Any) -> bool:
    return isinstance(value, dict) and all(_list_of(_count)(x) for x in value.values())


STEP_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "step": (_count, "an integer >= 0"),
    "mode": (_one_of(StepMode), _choices(StepMode)),
    "prefill": (_list_of(_chunk), "a list of {id, start, end, cached}"),
    "decode": (_list_of(_str), "a list of request ids"),
    "preempted": (_list_of(_str), "a list of request ids"),
    "num_tokens": (_count, "an integer >= 0"),
    "padded_tokens": (_count, "an integer >= 0"),
    "bucket": (_str, "a string"),
    "duration_s": (_non_negative, "a finite number >= 0"),
    "needed": (_part_dims, "a mapping of part to dims"),
    "padded": (_part_dims, "a mapping of part to dims"),
    "decode_lens": (_list_of(_count), "a list of integers >= 0"),
}


def _check(value: Any, check: Callable[[Any], bool], must: str, where: Any, key: str) -> None:
    if not check(value):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise RunFileError(f"{where}: field `{key}` is {shown}, which must be {must}")


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
        if not isinstance(line, dict):
            raise RunFileError(f"{where} is {_kind(line)}, not an object: remove the line")
        line.setdefault("index", len(lines))
        for key in ("id", "index", "output_ids"):
            if key not in line:
                raise RunFileError(f"{where}: no `{key}` field: remove the line")
        for key, (check, must) in GENERATION_FIELDS.items():
            if key in line:
                _check(line[key], check, must, where, key)
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
    from pipeline.metrics import StepRecord  # numpy only: review and summary stay light

    known = {f.name for f in fields(StepRecord)}
    optional = ("needed", "padded", "decode_lens")  # fields earlier versions did not write
    required = {f.name for f in fields(StepRecord) if f.name not in optional}
    steps = []
    for number, line in _lines(path):
        where = f"{path}:{number}"
        if not isinstance(line, dict):
            raise RunFileError(f"{where} is {_kind(line)}, not an object: remove the line")
        unknown = sorted(set(line) - known)
        if unknown:
            raise RunFileError(
                f"{where}: unknown field `{unknown[0]}` (a newer version's steps?): read the "
                "folder with the version that wrote it, or serve the run again"
            )
        missing = sorted(required - set(line))
        if missing:
            raise RunFileError(f"{where}: no `{missing[0]}` field: serve the run again")
        for key, (check, must) in STEP_FIELDS.items():
            if key in line:
                _check(line[key], check, must, where, key)
        steps.append(line)
    return steps


def cut_torn_tail(path: Path) -> int:
    """Removes a last line the writer never finished (no newline: a kill or a full disk),
    so that what is appended next starts a line of its own; returns the bytes removed."""
    if not path.is_file():
        return 0
    with open_no_link(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
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


def _kind(value: Any) -> str:
    """A JSON value's kind, as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {list: "a list", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]
