"""Trace formats: the columns and keys each names, and which format a file is, read
from its CSV header or first JSON line."""

from __future__ import annotations

import csv
import enum
import json
import re
from pathlib import Path


class TraceFormat(enum.StrEnum):
    """The trace formats read, by the name workload.format gives (members named by their
    values: OmegaConf matches a config value by name); auto: the file's header says."""

    auto = "auto"
    azure = "azure"
    burstgpt = "burstgpt"
    mooncake = "mooncake"
    sharegpt = "sharegpt"
    vidur = "vidur"


FORMATS = {
    TraceFormat.azure: "CSV TIMESTAMP,ContextTokens,GeneratedTokens",
    TraceFormat.burstgpt: (
        "CSV Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
    ),
    TraceFormat.mooncake: "JSONL timestamp,input_length,output_length,hash_ids",
    TraceFormat.sharegpt: "JSON list of {id, conversations: [{from, value}]}",
    TraceFormat.vidur: "CSV arrived_at,num_prefill_tokens,num_decode_tokens",
}
FORMAT_LIST = "; ".join(f"{name} ({what})" for name, what in FORMATS.items())

# CSV formats: the columns read, as (arrival, prompt tokens, output tokens), and the model's.
CSV_COLUMNS = {
    TraceFormat.azure: ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    TraceFormat.burstgpt: ("Timestamp", "Request tokens", "Response tokens"),
    TraceFormat.vidur: ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
}
BURSTGPT_MODEL = "Model"
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")

# A byte that is not UTF-8, as read with errors="surrogateescape": that row's error.
UNDECODED = re.compile("[\udc80-\udcff]")
NOT_UTF8 = "not valid UTF-8 text"
MAX_FIRST_LINE = 16 << 20


def _first_line(path: Path) -> str:
    """The first non-blank line, whole up to MAX_FIRST_LINE (a Mooncake line lists every
    prefix block's hash: a long prompt's is hundreds of kilobytes)."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(65536)
        while head.strip() and "\n" not in head.lstrip() and len(head) < MAX_FIRST_LINE:
            more = f.read(1 << 20)
            if not more:
                break
            head += more
    stripped = head.lstrip()
    return stripped.splitlines()[0] if stripped else ""


def detect_format(path: Path) -> TraceFormat | None:
    """The format a file's CSV header or first JSON line/character names, or None."""
    first = _first_line(path)
    if first.startswith("["):
        return TraceFormat.sharegpt
    if first.startswith("{"):
        try:
            line = json.loads(first)
        except ValueError:
            return None
        is_mooncake = isinstance(line, dict) and set(MOONCAKE_KEYS) <= set(line)
        return TraceFormat.mooncake if is_mooncake else None
    names = {name.strip() for name in next(csv.reader([first]), [])}
    for name, columns in CSV_COLUMNS.items():
        if set(columns) <= names and (name is not TraceFormat.burstgpt or BURSTGPT_MODEL in names):
            return name
    return None


def resolve_format(path: Path, format: str) -> TraceFormat:
    """The format to read `path` as; a file of no known format, or of another format than the
    one asked for, gets one line naming the formats."""
    detected = detect_format(path)
    if format == TraceFormat.auto and detected:
        return detected
    if format == detected:
        return detected
    snippet = _first_line(path)[:80]
    if detected:
        return _raise(
            f"workload.path={path} looks like a {detected} trace, not {format}: set "
            f"workload.format={detected} or auto"
        )
    asked = "a trace this reads" if format == TraceFormat.auto else f"a {format} trace"
    return _raise(
        f"workload.path={path} is not {asked} (it begins {snippet!r}); workload.format "
        f"reads {FORMAT_LIST}"
    )


def _raise(message: str) -> TraceFormat:
    raise ValueError(message)
