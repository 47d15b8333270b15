"""Bucket shapes: the prepared sizes of each dimension a step is padded to (warmup shapes)."""

from __future__ import annotations

import bisect
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from stages.arithmetic import ceil_div
from stages.forward.engine_grids import (
    vllm_exponential_range,
    vllm_limit,
    vllm_linear_range,
    vllm_padding_range,
)

log = structlog.get_logger(__name__)


class Bucketing(enum.StrEnum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    linear = "linear"  # min, then every step up to max
    exponential = "exponential"  # min, doubling, then max
    fastdeploy = "fastdeploy"  # FastDeploy's HPU runner's own sizes and warmup grid
    # vllm-gaudi's VLLM_BUCKETING_STRATEGY on each axis's min, step and max
    vllm_lin = "vllm_lin"  # min doubling up to step, then every step
    vllm_exp = "vllm_exp"  # ceil(log2 max) + 1 sizes spaced geometrically
    vllm_pad = "vllm_pad"  # padding-aware: at most 25% or max/4 padding
    cudagraph = (
        "cudagraph"  # a GPU's: decode batches at CUDA-graph sizes (stages/forward/cudagraph.py)
    )


@dataclass(frozen=True)
class Axis:
    """The prepared sizes of one bucket dimension: an explicit list when `explicit` is
    given, else min, step and max under a strategy. `step` also rounds a miss's fallback.
    `dense_max` (0: max) ends the linear strategy's steps early: past it sizes double up
    to max, for a range steps rarely reach (decode blocks only rows sharing a cached
    prefix list)."""

    min: int
    step: int
    max: int
    explicit: tuple[int, ...] = ()
    dense_max: int = 0

    def sizes(self, strategy: Bucketing | str) -> list[int]:
        if self.explicit:
            return list(self.explicit)
        top = self._rounded(self.max)
        if Bucketing(strategy) in VLLM_RANGES:
            return VLLM_RANGES[Bucketing(strategy)](self.min, self.step, top)
        if Bucketing(strategy) is Bucketing.exponential:
            return [*_doubling(self.min, top), top]
        dense = self._rounded(self.dense_max) if 0 < self.dense_max < self.max else top
        sizes = list(range(self.min, dense, self.step)) + [dense]
        if dense < top:
            sizes += [*_doubling(2 * dense, top), top]
        return sizes

    def _rounded(self, n: int) -> int:
        return ceil_div(n, self.step) * self.step


VLLM_RANGES = {
    Bucketing.vllm_lin: vllm_linear_range,
    Bucketing.vllm_exp: lambda lo, step, hi: vllm_exponential_range(lo, step, hi, vllm_limit(hi)),
    # vllm-gaudi's padding-aware defaults: pad_max a quarter of the range, 25%
    Bucketing.vllm_pad: lambda lo, step, hi: vllm_padding_range(lo, step, hi, ceil_div(hi, 4), 25),
}


def _doubling(start: int, top: int) -> list[int]:
    """start, 2 x start, ... below top."""
    sizes, n = [], start
    while n < top:
        sizes.append(n)
        n *= 2
    return sizes


class Buckets:
    """Finds the smallest prepared size >= n in each dimension; beyond the largest, a miss."""

    def __init__(self, strategy: Bucketing | str, axes: dict[str, Axis]) -> None:
        self.strategy = Bucketing(strategy)
        self.axes = axes
        self.sizes = {name: np.array(axis.sizes(self.strategy)) for name, axis in axes.items()}
        # The same sizes as lists: a step fits each dimension by bisection, faster on a
        # list than numpy's on an array for one number.
        self._listed = {name: sizes.tolist() for name, sizes in self.sizes.items()}
        # Again by kind, then dimension: "prefill_seq" is _by_kind["prefill"]["seq"].
        self._by_kind: dict[str, dict[str, list[int]]] = {}
        for axis, sizes in self._listed.items():
            kind, _, dim = axis.partition("_")
            self._by_kind.setdefault(kind, {})[dim] = sizes
        self.misses = 0
        self._missed_shapes: set[tuple] = set()

    def padded_prefill_tokens(self, shape: tuple[int, ...], real: int) -> int:
        """The tokens a prefill of `real` tokens in bucket `shape` computes: a GPU computes
        the real ones (its one wide bucket is not padded to), an HPU the bucket's rows x seq."""
        return real if self.strategy is Bucketing.cudagraph else shape[0] * shape[1]

    def fit(self, name: str, n: int) -> tuple[int, bool]:
        """(the size n is padded to, whether that size is a prepared one)."""
        sizes = self._listed[name]
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes):
            return sizes[i], True
        step = self.axes[name].step
        return ceil_div(n, step) * step, False  # fallback: an unprepared shape, never a dropped row

    def fit_prepared(self, name: str, values: np.ndarray) -> np.ndarray:
        """The prepared size each value pads to, as `fit` finds it, for the leading values
        that have one: the result stops at the first beyond the largest size."""
        sizes = self.sizes[name]
        at = sizes.searchsorted(values)  # (np.searchsorted's wrapper costs more than it)
        try:
            return sizes[at]  # the common case: every value has one
        except IndexError:  # one is past the largest size
            return sizes[at[: (at == len(sizes)).nonzero()[0][0]]]

    def pad(self, kind: str, dims: Mapping[str, int]) -> tuple[tuple[int, ...], bool]:
        """(the bucket of a `kind` step needing `dims`, whether every size is prepared)."""
        fitted = [self.fit(f"{kind}_{name}", n) for name, n in dims.items()]
        return tuple(size for size, _ in fitted), all(hit for _, hit in fitted)

    def shape(self, kind: str, **dims: int) -> tuple[int, ...]:
        """The bucket of a `kind` (prefill, decode) step; counts and logs a miss."""
        return self.fitted(kind, dims)

    def fitted(self, kind: str, dims: dict[str, int]) -> tuple[int, ...]:
        """`shape` for `dims` given as a dict: once per step, so the common case (every
        size prepared) fits each dimension inline."""
        shape, listed = [], self._by_kind[kind]
        for name, n in dims.items():
            sizes = listed[name]
            i = bisect.bisect_left(sizes, n)
            if i == len(sizes):
                return self._missed(kind, dims)
            shape.append(sizes[i])
        return tuple(shape)

    def _missed(self, kind: str, dims: dict[str, int]) -> tuple[int, ...]:
        """The fallback bucket of a step some dimension of which no prepared size holds;
        counts the miss and logs each such bucket once."""
        shape, _ = self.pad(kind, dims)
        self.misses += 1
        if (kind, shape) not in self._missed_shapes:
            self._missed_shapes.add((kind, shape))
            log.warning("bucket_miss", kind=kind, needed=dims, fallback=shape)
        return shape


@dataclass(frozen=True)
class StepRule:
    """What the scheduler guarantees about a step's shape: the warmup grid follows it."""

    block_size: int
    max_tokens: int
    mixed: bool  # chunked prefill: steps mix a prompt's chunk with decodes
    padded_budget: bool = True  # the budget bounds prefill rows x padded width


def _floors(sizes: np.ndarray) -> np.ndarray:
    """Each size's predecessor in its sorted list (0 for the first): a value pads to a size
    exactly when it lies above that predecessor."""
    return np.concatenate([[0], sizes[:-1]])


def _reachable_prefill(
    batch: np.ndarray, seq: np.ndarray, block_size: int, budget: int, padded_budget: bool
) -> np.ndarray:
    """[batch sizes, seq sizes]: whether some step the scheduler can make pads to (B, S).
    The least step padding to it has floor(B) + 1 rows and a widest row of floor(S) + 1
    tokens (floor(S) + block_size once rounded to whole blocks); under the padded budget
    rows x rounded width fits max_tokens, under the real one the widest row plus one token
    for each other row does."""
    rows = _floors(batch)[:, None] + 1
    width = _floors(seq)[None, :] + block_size
    need = rows * width if padded_budget else width - block_size + rows
    return need <= budget


def _prefill_axes(
    batch: Sequence[int],
    seq: Sequence[int],
    blocks: Sequence[int],
    block_size: int,
    budget: int,
    padded_budget: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The sorted axes, which (batch, seq) pairs a step can reach, and per seq size the
    least table that holds its chunk (M * block_size > floor(S))."""
    batch_arr, seq_arr, blocks_arr = (
        np.sort(np.asarray(v, dtype=np.int64)) for v in (batch, seq, blocks)
    )
    reach = _reachable_prefill(batch_arr, seq_arr, block_size, budget, padded_budget)
    least = _floors(seq_arr) // block_size + 1
    return batch_arr, seq_arr, blocks_arr, reach, least


def prefill_count(
    batch: Sequence[int],
    seq: Sequence[int],
    blocks: Sequence[int],
    block_size: int,
    budget: int,
    padded_budget: bool = True,
) -> int:
    """Prefill warmup shapes: every (batch, seq, blocks) some step can pad to (see
    prefill_shapes), counted without listing them."""
    _, _, blocks_sorted, reach, least = _prefill_axes(
        batch, seq, blocks, block_size, budget, padded_budget
    )
    wide = blocks_sorted.size - np.searchsorted(blocks_sorted, least)
    return int((reach.sum(axis=0) * wide).sum())


def prefill_shapes(
    batch: Sequence[int],
    seq: Sequence[int],
    blocks: Sequence[int],
    block_size: int,
    budget: int,
    padded_budget: bool = True,
) -> list[tuple[int, int, int]]:
    """Every prefill bucket some step can pad to: warming exactly these leaves no prefill
    compile to serving. A step of b rows whose widest chunk rounds to s tokens and whose
    widest table has m blocks (m * block_size >= s) pads each dim on its own, so (B, S, M)
    is reachable when the least such step fits the budget and M is above floor(M)."""
    batch_arr, seq_arr, blocks_arr, reach, least = _prefill_axes(
        batch, seq, blocks, block_size, budget, padded_budget
    )
    return [
        (int(b), int(s), int(m))
        for i, b in enumerate(batch_arr)
        for j, s in enumerate(seq_arr)
        if reach[i, j]
        for m in blocks_arr
        if m >= least[j]
    ]


def is_warmed(
    kind: str, shape: tuple[int, ...], sizes: Mapping[str, Sequence[int]], rule: StepRule
) -> bool:
    """Whether warmup compiles this bucket of a `kind` (prefill, decode) part: the same
    test as prefill_shapes and decode_shapes, for one shape."""
    names = [
        f"{kind}_{dim}"
        for dim in (("batch", "seq", "blocks") if kind == "prefill" else ("batch", "blocks"))
    ]
    if any(size not in sizes[name] for size, name in zip(shape, names, strict=True)):
        return False
    below = [
        max((v for v in sizes[n] if v < size), default=0)
        for size, n in zip(shape, names, strict=True)
    ]
    if kind == "decode":
        return shape[1] > below[0]
    rows, width = below[0] + 1, below[1] + rule.block_size
    need = rows * width if rule.padded_budget else width - rule.block_size + rows
    return need <= rule.max_tokens and shape[2] * rule.block_size >= width


def decode_shapes(batch: Sequence[int], blocks: Sequence[int]) -> list[tuple[int, int]]:
    """Every decode bucket some step can pad to: each row lists at least one block, so
    B rows pad to a blocks size M only when M > floor(B)."""
    batch_arr = np.sort(np.asarray(batch, dtype=np.int64))
    blocks_arr = np.sort(np.asarray(blocks, dtype=np.int64))
    return [
        (int(b), int(m))
        for b, low in zip(batch_arr, _floors(batch_arr), strict=True)
        for m in blocks_arr
        if m > low
    ]


def decode_count(batch: Sequence[int], blocks: Sequence[int]) -> int:
    """len(decode_shapes(batch, blocks)), counted without listing them."""
    low = _floors(np.sort(np.asarray(batch, dtype=np.int64)))
    blocks_sorted = np.sort(np.asarray(blocks, dtype=np.int64))
    return int((blocks_sorted.size - np.searchsorted(blocks_sorted, low, side="right")).sum())


def mixed_pairs(
    sizes: Mapping[str, Sequence[int]], budget: int
) -> list[tuple[tuple[int, int, int], tuple[int, int]]]:
    """The mixed warmup grid (FastDeploy warms one): one prefill row, padded to the
    smallest batch size, of each seq beside each decode batch, the widest tables, within
    the budget. Its graphs are mostly the prefill and decode phases' own."""
    rows = min(sizes["prefill_batch"])
    widest_p, widest_d = max(sizes["prefill_blocks"]), max(sizes["decode_blocks"])
    return [
        ((rows, s, widest_p), (b, widest_d))
        for s in sorted(sizes["prefill_seq"])
        for b in sorted(sizes["decode_batch"])
        if rows * s + b <= budget
    ]


def warmup_graphs(
    sizes: Mapping[str, Sequence[int]],
    block_size: int,
    max_tokens: int,
    mixed: bool,
    padded_budget: bool = True,
) -> dict[str, list[tuple]]:
    """The (prefill, decode) bucket pairs each warmup phase runs."""
    phases: dict[str, list[tuple]] = {
        "prefill": [
            (p, None)
            for p in prefill_shapes(
                sizes["prefill_batch"],
                sizes["prefill_seq"],
                sizes["prefill_blocks"],
                block_size,
                max_tokens,
                padded_budget,
            )
        ],
        "decode": [(None, d) for d in decode_shapes(sizes["decode_batch"], sizes["decode_blocks"])],
    }
    if mixed:
        phases["mixed"] = mixed_pairs(sizes, max_tokens)
    return phases


def warmup_counts(
    sizes: Mapping[str, Sequence[int]],
    block_size: int,
    max_tokens: int,
    mixed: bool,
    padded_budget: bool = True,
) -> dict[str, int]:
    """The graphs each warmup phase compiles that no earlier phase did (a graph is one
    part's bucket, as the device compiles them), counted without listing the prefill and
    decode phases (their product can run to millions): the sum is warmup_shapes in
    metrics.json."""
    counts = {
        "prefill": prefill_count(
            sizes["prefill_batch"],
            sizes["prefill_seq"],
            sizes["prefill_blocks"],
            block_size,
            max_tokens,
            padded_budget,
        ),
        "decode": decode_count(sizes["decode_batch"], sizes["decode_blocks"]),
    }
    if mixed:
        counts["mixed"] = len(_new_mixed_graphs(sizes, block_size, max_tokens, padded_budget))
    return counts


def _new_mixed_graphs(
    sizes: Mapping[str, Sequence[int]], block_size: int, max_tokens: int, padded_budget: bool
) -> set[tuple]:
    """The mixed grid's part buckets that the prefill and decode phases do not hold, found
    without listing the grid or the phases: a seq size is in some pair when it fits beside
    the smallest decode batch, a decode batch when it fits beside the shortest seq."""
    rows = min(sizes["prefill_batch"])
    widest_p, widest_d = max(sizes["prefill_blocks"]), max(sizes["decode_blocks"])
    seq = np.sort(np.asarray(sizes["prefill_seq"], dtype=np.int64))
    batch = np.sort(np.asarray(sizes["decode_batch"], dtype=np.int64))
    in_pairs_p = rows * seq + batch[0] <= max_tokens
    in_pairs_d = rows * seq[0] + batch <= max_tokens
    # the prefill phase holds (rows, s, widest_p) when that step is reachable (as in
    # prefill_shapes, rows being the smallest batch size) and the widest table holds it
    reach = _reachable_prefill(np.array([rows]), seq, block_size, max_tokens, padded_budget)[0]
    held_p = reach & (widest_p >= _floors(seq) // block_size + 1)
    held_d = widest_d > _floors(batch)  # as in decode_shapes
    new: set[tuple] = {("prefill", (rows, int(s), widest_p)) for s in seq[in_pairs_p & ~held_p]}
    new.update(("decode", (int(b), widest_d)) for b in batch[in_pairs_d & ~held_d])
    return new
