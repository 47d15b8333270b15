"""Bucket shapes: the prepared sizes of each dimension a step is padded to (warmup shapes)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
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
    """The prepared sizes of one bucket dimension: an explicit list when `explicit` is
    given, else min, step and max under a strategy. `step` also rounds a miss's fallback."""

    min: int
    step: int
    max: int
    explicit: tuple[int, ...] = ()

    def sizes(self, strategy: Bucketing | str) -> list[int]:
        if self.explicit:
            return list(self.explicit)
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

    def pad(self, kind: str, dims: Mapping[str, int]) -> tuple[tuple[int, ...], bool]:
        """(the bucket of a `kind` step needing `dims`, whether every size is prepared)."""
        fitted = [self.fit(f"{kind}_{name}", n) for name, n in dims.items()]
        return tuple(size for size, _ in fitted), all(hit for _, hit in fitted)

    def shape(self, kind: str, **dims: int) -> tuple[int, ...]:
        """The bucket of a `kind` (prefill, decode) step; counts and logs a miss."""
        shape, hit = self.pad(kind, dims)
        if not hit:
            self.misses += 1
            if (kind, shape) not in self._missed_shapes:
                self._missed_shapes.add((kind, shape))
                log.warning("bucket_miss", kind=kind, needed=dims, fallback=shape)
        return shape


def prefill_count(
    batch: Sequence[int], seq: Sequence[int], blocks: Sequence[int], block_size: int, budget: int
) -> int:
    """Prefill warmup shapes: batch * seq within the budget, and block tables wide enough
    for the chunk (blocks * block_size >= seq)."""
    batch_sorted = np.sort(np.asarray(batch, dtype=np.int64))
    seq_arr = np.asarray(seq, dtype=np.int64)
    blocks_sorted = np.sort(np.asarray(blocks, dtype=np.int64))
    in_budget = np.searchsorted(batch_sorted, budget // seq_arr, side="right")
    wide = blocks_sorted.size - np.searchsorted(blocks_sorted, -(-seq_arr // block_size))
    return int((in_budget * wide).sum())


def mixed_count(seq: Sequence[int], decode_batch: Sequence[int], budget: int) -> int:
    """Mixed warmup shapes: one prefill row of each seq beside each decode batch, within
    the budget."""
    batch_sorted = np.sort(np.asarray(decode_batch, dtype=np.int64))
    rest = budget - np.asarray(seq, dtype=np.int64)
    return int(np.searchsorted(batch_sorted, rest, side="right").sum())


def warmup_counts(
    sizes: Mapping[str, Sequence[int]], block_size: int, max_tokens: int, mixed: bool
) -> dict[str, int]:
    """How many shapes each warmup phase compiles, counted arithmetically (the product of
    the axes can run to millions): the same filters as the builder's warmup_shapes."""
    counts = {
        "prefill": prefill_count(
            sizes["prefill_batch"],
            sizes["prefill_seq"],
            sizes["prefill_blocks"],
            block_size,
            max_tokens,
        ),
        "decode": len(sizes["decode_batch"]) * len(sizes["decode_blocks"]),
    }
    if mixed:
        counts["mixed"] = mixed_count(sizes["prefill_seq"], sizes["decode_batch"], max_tokens)
    return counts
