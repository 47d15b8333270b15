"""Bucket shapes: the prepared sizes of each dimension a step is padded to (warmup shapes)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import structlog

log = structlog.get_logger(__name__)


class Bucketing(str, enum.Enum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    linear = "linear"  # min, then every step up to max
    exponential = "exponential"  # min, doubling, then max


@dataclass(frozen=True)
class Axis:
    """The prepared sizes of one bucket dimension."""

    min: int
    step: int
    max: int

    def sizes(self, strategy: Bucketing | str) -> list[int]:
        top = -(-self.max // self.step) * self.step
        if Bucketing(strategy) is Bucketing.exponential:
            sizes, n = [], self.min
            while n < top:
                sizes.append(n)
                n *= 2
            return [*sizes, top]
        return list(range(self.min, top, self.step)) + [top]


class Buckets:
    """Finds the smallest prepared size >= n in each dimension; beyond the largest, a miss."""

    def __init__(self, strategy: Bucketing | str, axes: dict[str, Axis]) -> None:
        self.strategy = Bucketing(strategy)
        self.axes = axes
        self.sizes = {name: np.array(axis.sizes(self.strategy)) for name, axis in axes.items()}
        self.misses = 0
        self._missed_shapes: set[tuple] = set()

    def fit(self, name: str, n: int) -> tuple[int, bool]:
        """(the size n is padded to, whether that size is a prepared one)."""
        sizes = self.sizes[name]
        i = int(np.searchsorted(sizes, n))
        if i < len(sizes):
            return int(sizes[i]), True
        step = self.axes[name].step
        return -(-n // step) * step, False  # fallback: an unprepared shape, never a dropped row

    def shape(self, kind: str, **dims: int) -> tuple[int, ...]:
        """The bucket of a `kind` (prefill, decode) step; counts and logs a miss."""
        fitted = [self.fit(f"{kind}_{name}", n) for name, n in dims.items()]
        shape = tuple(size for size, _ in fitted)
        if not all(hit for _, hit in fitted):
            self.misses += 1
            if (kind, shape) not in self._missed_shapes:
                self._missed_shapes.add((kind, shape))
                log.warning("bucket_miss", kind=kind, needed=dims, fallback=shape)
        return shape
