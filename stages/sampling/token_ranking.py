"""Tokens ranked by their logits, one order for sampling and for reporting log-probabilities
alike: distinct integer keys per row (ties to the lower token id), the top entries by key, and
a row's log-softmax."""

from __future__ import annotations

import numpy as np


def rank_keys(logits: np.ndarray) -> np.ndarray:
    """An int64 key per entry, all distinct in a row, ascending from the most likely token;
    tied logits go lower token id first.

    Distinct keys make every sort and partition pick the same tokens whatever else is in the
    batch or however many candidates are taken, even among tied logits."""
    bits = np.ascontiguousarray(logits, dtype=np.float32).view(np.int32)
    # IEEE floats order like signed integers once a negative one's non-sign bits are flipped.
    ordered = np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)
    # ~ordered reverses the order without overflow; the low half breaks ties by token id.
    return ((~ordered).astype(np.int64) << 32) | np.arange(logits.shape[-1], dtype=np.int64)


def top_indices(keys: np.ndarray, count: int) -> np.ndarray:
    """The `count` most likely entries of each row by rank key, most likely first."""
    if count < keys.shape[-1]:
        part = np.argpartition(keys, count - 1, axis=-1)[:, :count]
        order = np.argsort(np.take_along_axis(keys, part, axis=-1), axis=-1)
        return np.take_along_axis(part, order, axis=-1)
    return np.argsort(keys, axis=-1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    peak = x.max(axis=-1, keepdims=True)
    return x - (peak + np.log(np.exp(x - peak).sum(axis=-1, keepdims=True)))
