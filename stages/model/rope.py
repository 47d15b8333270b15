"""Rotary position frequencies, in numpy: checked when a config is read, used by the model."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


class RopeType(enum.StrEnum):
    """The rope scaling kinds computed, by the name config.json's `rope_type` gives."""

    DEFAULT = "default"  # none
    LINEAR = "linear"  # every frequency divided by `factor`
    LLAMA3 = "llama3"  # long wavelengths divided by `factor`, short ones kept


def rope_type(scaling: Mapping[str, Any] | None) -> str:
    """The rope scaling kind a config names ("rope_type", formerly "type"); none = default."""
    if not scaling:
        return RopeType.DEFAULT
    return str(scaling.get("rope_type", scaling.get("type", RopeType.DEFAULT)))


def rope_inv_freq(
    head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None
) -> np.ndarray:
    """The rotation frequency of each of head_dim / 2 pairs, float64, after rope scaling."""
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) / half)
    kind = rope_type(scaling)
    supported = [t.value for t in RopeType]
    if kind not in supported:
        raise ValueError(
            f"rope_scaling type {kind!r} is not supported: choose one of {', '.join(supported)}"
        )
    if kind == RopeType.DEFAULT or scaling is None:
        return inv_freq
    factor = _positive(scaling, "factor")
    if kind == RopeType.LINEAR:
        return inv_freq / factor
    # llama3: long wavelengths slow down by `factor`, short ones stay, a smooth blend between.
    low = _positive(scaling, "low_freq_factor")
    high = _positive(scaling, "high_freq_factor")
    original = _positive(scaling, "original_max_position_embeddings")
    if high <= low:
        raise ValueError(
            f"rope_scaling: high_freq_factor={high} must be above low_freq_factor={low}"
        )
    wavelen = 2 * math.pi / inv_freq
    smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _positive(scaling: Mapping[str, Any], key: str) -> float:
    value = scaling.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"rope_scaling.{key}={value!r}: needs a positive number")
    return float(value)
