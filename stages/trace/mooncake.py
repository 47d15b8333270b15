"""Mooncake JSONL traces: timestamps in ms, lengths, and the prefix blocks' hash ids."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from stages.trace.fields import token_count
from stages.trace.formats import MOONCAKE_KEYS, NOT_UTF8, UNDECODED
from stages.trace.rows import TraceRows, forward_filled


def _mooncake_entry(raw: str) -> tuple[float, int, int, tuple[int, ...]]:
    entry = json.loads(raw)
    if not isinstance(entry, dict):
        raise ValueError("a line must be a JSON object")
    missing = [k for k in (*MOONCAKE_KEYS, "hash_ids") if k not in entry]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    stamp = entry["timestamp"]
    if not isinstance(stamp, int | float) or isinstance(stamp, bool) or not np.isfinite(stamp):
        raise ValueError(f"timestamp={stamp!r} is not a number of ms")
    n_in = token_count(entry["input_length"], "input_length", 1)
    n_out = token_count(entry["output_length"], "output_length", 0)
    hashes = entry["hash_ids"]
    if not isinstance(hashes, list):
        raise ValueError("hash_ids must be a list of whole numbers >= 0")
    return stamp / 1000.0, n_in, n_out, tuple(token_count(h, "hash_ids entry", 0) for h in hashes)


def read_mooncake(path: Path) -> TraceRows:
    """Mooncake JSONL rows: timestamp in ms, lengths, and the prefix blocks' hash ids."""
    lines: list[int] = []
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hash_ids: list[tuple[int, ...]] = []
    errors: dict[int, str] = {}
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                if UNDECODED.search(raw):
                    raise ValueError(NOT_UTF8)
                row = _mooncake_entry(raw)
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                errors[line] = str(err)
                row = (np.nan, -1, 0, ())
            lines.append(line)
            columns: tuple[list[Any], ...] = (times, inputs, outputs, hash_ids)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
    inputs_array = np.array(inputs, dtype=np.int64)
    return TraceRows(
        lines=np.array(lines, dtype=np.int64),
        times=forward_filled(np.array(times, dtype=np.float64), inputs_array >= 0),
        inputs=inputs_array,
        outputs=np.array(outputs, dtype=np.int64),
        errors=errors,
        counts=Counter(rows=len(lines), malformed=len(errors)),
        hash_ids=hash_ids,
    )
