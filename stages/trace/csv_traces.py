"""Azure, BurstGPT and Vidur CSV traces read into rows, column by column."""

from __future__ import annotations

import csv
import io
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stages.trace.fields import MAX_COUNT, datetime_seconds, parse_seconds, token_count
from stages.trace.formats import BURSTGPT_MODEL, CSV_COLUMNS, NOT_UTF8, UNDECODED, TraceFormat
from stages.trace.rows import TraceRows, forward_filled


def _csv_records(text: str) -> tuple[list[list[str]], Sequence[int]]:
    """The non-blank CSV records and their line numbers; a file without quotes or blank lines
    (the usual trace) takes a fast path with no per-row Python loop for the numbers."""
    if '"' not in text:
        lines = text.splitlines()
        if all(lines):
            return [line.split(",") for line in lines], range(1, len(lines) + 1)
    reader = csv.reader(io.StringIO(text, newline=""))
    records, numbers = [], []
    for record in reader:
        if record:
            records.append(record)
            numbers.append(reader.line_num)
    return records, numbers


def _column(values: list[str], bulk: Any, one: Any) -> tuple[np.ndarray, dict[int, str]]:
    """A column converted in one numpy call, or, when a value is bad, value by value with
    each bad one's message."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's deprecated time-zone parse: go one by one
            return bulk(values), {}
    except (ValueError, TypeError, OverflowError, Warning):
        out, errors = np.zeros(len(values)), {}
        for i, value in enumerate(values):
            try:
                out[i] = one(value)
            except ValueError as err:
                errors[i] = str(err)
        return out, errors


def _count_column(values: list[str], name: str, minimum: int) -> tuple[np.ndarray, dict]:
    counts, errors = _column(
        values, lambda v: np.array(v).astype(np.int64), lambda v: token_count(v, name, minimum)
    )
    counts = counts.astype(np.int64)
    for i in np.flatnonzero(counts < minimum).tolist():
        errors.setdefault(i, f"{name}={counts[i]} must be >= {minimum}")
    for i in np.flatnonzero(counts > MAX_COUNT).tolist():
        errors.setdefault(i, f"{name}={counts[i]} is more tokens than any context ({MAX_COUNT})")
    return counts, errors


def _time_column(values: list[str], format: TraceFormat, name: str) -> tuple[np.ndarray, dict]:
    bulk: Callable[[list[str]], np.ndarray]
    if format is TraceFormat.azure:
        bulk = _bulk_datetimes
        one = datetime_seconds
    else:
        bulk = lambda v: np.array(v).astype(np.float64)  # noqa: E731
        one = parse_seconds
    times, errors = _column(values, bulk, one)
    for i in np.flatnonzero(~np.isfinite(times)).tolist():
        errors.setdefault(i, f"{values[i]!r} is not a finite time")
    return times, {i: f"{name}: {message}" for i, message in errors.items()}


def _bulk_datetimes(values: list[str]) -> np.ndarray:
    stamps = np.array(values, dtype="datetime64[ns]")
    seconds = stamps.astype(np.int64) / 1e9
    return np.where(np.isnat(stamps), np.nan, seconds)


def _record_errors(text: str, records: list[list[str]], width: int) -> dict[int, str]:
    """Rows whose field count is not the header's, or that hold a byte that is not UTF-8."""
    errors = {
        i: f"{len(r)} fields, the header has {width}"
        for i, r in enumerate(records)
        if len(r) != width
    }
    if UNDECODED.search(text):  # rare: only then is every row searched
        for i, record in enumerate(records):
            if any(UNDECODED.search(field) for field in record):
                errors[i] = NOT_UTF8
    return errors


def read_csv_trace(path: Path, format: TraceFormat, model_filter: str = "") -> TraceRows:
    """Azure, BurstGPT or Vidur rows; BurstGPT rows of 0 response tokens are failed requests,
    skipped and counted, and `model_filter` keeps one model's rows."""
    text = path.read_text(encoding="utf-8-sig", errors="surrogateescape")
    records, numbers = _csv_records(text)
    header = [name.strip() for name in records[0]]
    records, lines = records[1:], np.asarray(numbers[1:], dtype=np.int64)
    counts: Counter = Counter(rows=len(records))
    errors = _record_errors(text, records, len(header))
    t_name, in_name, out_name = CSV_COLUMNS[format]
    if errors:  # the columns below are read from full rows only: put blanks in the others
        records = [r if len(r) == len(header) else [""] * len(header) for r in records]
    keep = np.ones(len(records), dtype=bool)
    if format is TraceFormat.burstgpt and model_filter:
        c_model = header.index(BURSTGPT_MODEL)
        keep = np.array([r[c_model] == model_filter for r in records], dtype=bool)
        keep[list(errors)] = True  # a malformed row is reported whatever its model
        counts["other_model_skipped"] = int((~keep).sum())
    columns = [[r[header.index(name)] for r in records] for name in CSV_COLUMNS[format]]
    times, time_errors = _time_column(columns[0], format, t_name)
    inputs, in_errors = _count_column(columns[1], in_name, 1)
    outputs, out_errors = _count_column(columns[2], out_name, 0)
    for found in (time_errors, in_errors, out_errors):
        for i, message in found.items():
            if keep[i]:  # another model's row is skipped, however its numbers read
                errors.setdefault(i, message)
    valid = np.ones(len(records), dtype=bool)
    valid[list(errors)] = False
    if format is TraceFormat.burstgpt:
        failed = valid & keep & (outputs == 0)
        counts["failed_skipped"] = int(failed.sum())
        keep &= ~failed
    counts["malformed"] = len(errors)
    inputs = np.where(valid, inputs, -1)
    times = forward_filled(times, valid & keep)
    return TraceRows(
        lines=lines[keep],
        times=times[keep],
        inputs=inputs[keep],
        outputs=outputs[keep],
        errors={int(lines[i]): message for i, message in errors.items()},
        counts=counts,
    )
