"""A token-count trace read into arrays: one row per line, malformed rows kept with their
message."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass
class TraceRows:
    """A token-count trace's kept rows as arrays. A malformed row is kept too, as inputs -1
    with its message in `errors`, and the time of the good row before it (NaN if none)."""

    lines: np.ndarray
    times: np.ndarray  # seconds
    inputs: np.ndarray
    outputs: np.ndarray
    errors: dict[int, str]  # line -> message
    counts: Counter
    hash_ids: list[tuple[int, ...]] | None = None  # Mooncake's, per row


def forward_filled(times: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each invalid entry takes the time of the valid one before it, NaN before the first."""
    times = np.where(valid, times, np.nan)
    last = np.maximum.accumulate(np.where(valid, np.arange(len(times)), 0))
    return times[last] if len(times) else times
