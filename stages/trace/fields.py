"""A trace row's fields: date-times, seconds and token counts read with one-line errors."""

from __future__ import annotations

import functools
import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import numpy as np

MAX_COUNT = 1 << 31  # tokens in one prompt or output: beyond any model's context

_EPOCH = datetime(1970, 1, 1)
_DATETIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?")


@functools.lru_cache(maxsize=4096)
def _whole_seconds(text: str) -> float:
    # Rows of a trace share their whole second, so most parses are a cache hit.
    return (datetime.fromisoformat(text) - _EPOCH).total_seconds()


def datetime_seconds(text: str) -> float:
    """Seconds since 1970 of a date-time like `2023-11-16 18:15:46.6805900` (any number of
    fractional digits, which Python 3.10's fromisoformat refuses; an optional UTC offset)."""
    match = _DATETIME.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a date-time like 2023-11-16 18:15:46.6805900")
    seconds = _whole_seconds(match[1].replace("T", " "))
    if match[2]:
        seconds += float(match[2])
    zone = match[3]
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        hours, minutes = int(zone[1:3]), int(zone[-2:])
        if hours > 23 or minutes > 59:  # no place is a day or more from UTC
            raise ValueError(f"{text!r} has the UTC offset {zone}, which no place has")
        seconds -= sign * (hours * 3600 + minutes * 60)
    return seconds


def parse_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not np.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number of seconds")
    return value


def token_count(value: Any, name: str, minimum: int) -> int:
    """A token count from a CSV string or a JSON value: a whole number >= minimum."""
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            as_float = float(value) if _is_number(value) else None
            if as_float is None or not as_float.is_integer():
                raise ValueError(f"{name}={value!r} is not a whole number") from None
            number = int(as_float)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ValueError(f"{name}={value!r} is not a whole number")
    if number < minimum:
        raise ValueError(f"{name}={number} must be >= {minimum}")
    if number > MAX_COUNT:
        raise ValueError(f"{name}={number} is more tokens than any context ({MAX_COUNT})")
    return number


def _is_number(text: str) -> bool:
    try:
        return np.isfinite(float(text))
    except ValueError:
        return False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a trace becomes objects: none of them is garbage,
    and its passes over the growing heap would cost more than the load itself (3x here)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
