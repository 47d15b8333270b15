"""Chooses bucket sizes from a workload's observed steps, within a warmup shape budget.

The cost of a set over the observed steps is what padding adds: padded tokens (prefill
rows x seq plus decode rows, ForwardMeta.padded_tokens) plus, for the block axes, which
cost attention work rather than tokens, `block_weight * block_size` token-equivalents
per padded block (a padded block is block_size KV slots read for nothing).

Per axis the problem is 1-D: a step needing n pays w * (smallest size >= n), so the best
k sizes are a k-breakpoint partition of the observed values' histogram, found exactly by
dynamic programming; the observed maximum is always a size, so every observed step fits.
Prefill batch and seq multiply, so they are chosen together: every batch set is tried
with its exact seq sizes while the sets are few (EXHAUSTIVE_LIMIT), else each axis is
exact given the other, alternated until neither improves (a local optimum). The shape
count couples the axes (warmup compiles the filtered product), so every split of the
budget into sizes per axis is searched, keeping the cheapest whose count fits and whose
padded steps all land on shapes warmup compiles. Each axis takes its cheapest sizes for
its count; when the warmup filters would prefer other sizes of that count, the result
can fall short of the global optimum (the tests compare it with brute force).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stages.buckets import Buckets, mixed_count, prefill_count, warmup_counts

TOKEN_AXES = ("prefill_batch", "prefill_seq", "decode_batch")
BLOCK_AXES = ("prefill_blocks", "decode_blocks")


@dataclass
class Workload:
    """The unpadded dims of observed steps: what bucket sizes are chosen from."""

    prefill: np.ndarray  # [steps with a prefill part, 3]: batch, seq, blocks per row
    decode: np.ndarray  # [steps with a decode part, 2]: batch, blocks
    real_tokens: int

    @classmethod
    def of(cls, records: Iterable[Mapping]) -> Workload:
        """From steps.jsonl lines (each with `needed` and `num_tokens`)."""
        prefill, decode, real = [], [], 0
        for record in records:
            needed = record["needed"]
            if "prefill" in needed:
                prefill.append(needed["prefill"])
            if "decode" in needed:
                decode.append(needed["decode"])
            real += int(record["num_tokens"])
        return cls(
            np.array(prefill, dtype=np.int64).reshape(-1, 3),
            np.array(decode, dtype=np.int64).reshape(-1, 2),
            real,
        )

    def axis_values(self) -> dict[str, np.ndarray]:
        """Each axis's needed value in every step that has the axis's part."""
        return {
            "prefill_batch": self.prefill[:, 0],
            "prefill_seq": self.prefill[:, 1],
            "prefill_blocks": self.prefill[:, 2],
            "decode_batch": self.decode[:, 0],
            "decode_blocks": self.decode[:, 1],
        }


# -- one axis: the exact k-breakpoint partition ----------------------------------------------
def histogram(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, the summed weight of each)."""
    distinct, index = np.unique(values, return_inverse=True)
    return distinct, np.bincount(index, weights=weights, minlength=distinct.size)


def breakpoint_table(
    values: np.ndarray, weights: np.ndarray, k_max: int
) -> list[tuple[float, list[int]]]:
    """For k = 1..min(k_max, distinct values): (the least sum of weight * padded value, its
    k sizes). The sizes are observed values, the largest among them: lowering a size to
    the largest value it pads loses nothing, so an optimum uses observed values only."""
    v, w = histogram(values, weights)
    n = v.size
    cum = np.concatenate([[0.0], np.cumsum(w)])
    # cost[a, b]: values a..b padded to v[b] (a <= b); inf elsewhere.
    cost = v[None, :].astype(np.float64) * (cum[None, 1:] - cum[:-1, None])
    cost[np.tril_indices(n, -1)] = np.inf
    best = cost[0].copy()  # k = 1: values 0..b-1 in one group
    choices: list[np.ndarray] = []
    table = [(float(best[-1]), [int(v[-1])])]
    for _ in range(2, min(k_max, n) + 1):
        # the last group starts at a + 1 after the best k-1 groups over values 0..a
        total = best[:-1, None] + cost[1:, :]
        choice = np.argmin(total, axis=0)
        best = total[choice, np.arange(n)]
        best[0] = np.inf  # values 0..0 cannot be split in k >= 2 groups
        choices.append(choice)
        table.append((float(best[-1]), _backtrack(v, choices, n - 1)))
    return table


def _backtrack(v: np.ndarray, choices: list[np.ndarray], last: int) -> list[int]:
    sizes, end = [int(v[last])], last
    for choice in reversed(choices):
        end = int(choice[end])
        sizes.append(int(v[end]))
    return sorted(sizes)


def pad_to(values: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Each value padded to the smallest size >= it (every value fits: max is a size)."""
    arr = np.asarray(sizes, dtype=np.int64)
    return arr[np.minimum(np.searchsorted(arr, values), arr.size - 1)]


# -- prefill batch x seq, chosen together -----------------------------------------------------
EXHAUSTIVE_LIMIT = 256  # batch size sets tried one by one at most; beyond, alternation


def plan_prefill_pair(
    batch: np.ndarray, seq: np.ndarray, k_batch: int, k_seq: int
) -> tuple[float, list[int], list[int]]:
    """(padded tokens, batch sizes, seq sizes) with k_batch and k_seq sizes. Exact when
    the batch sets are few enough to try each (the seq sizes are then exact for each);
    otherwise each axis exact given the other, alternated from both starts."""
    distinct = np.unique(batch)
    top, rest = int(distinct[-1]), [int(v) for v in distinct[:-1]]
    k_batch = min(k_batch, distinct.size)
    if math.comb(len(rest), k_batch - 1) <= EXHAUSTIVE_LIMIT:
        candidates = ([*c, top] for c in itertools.combinations(rest, k_batch - 1))
        return min(
            (_seq_given_batch(batch, seq, list(sizes), k_seq) for sizes in candidates),
            key=lambda plan: plan[0],
        )
    return _alternate(batch, seq, k_batch, k_seq)


def _seq_given_batch(
    batch: np.ndarray, seq: np.ndarray, batch_sizes: list[int], k_seq: int
) -> tuple[float, list[int], list[int]]:
    cost, seq_sizes = breakpoint_table(seq, pad_to(batch, batch_sizes), k_seq)[-1]
    return cost, batch_sizes, seq_sizes


def _alternate(
    batch: np.ndarray, seq: np.ndarray, k_batch: int, k_seq: int, rounds: int = 20
) -> tuple[float, list[int], list[int]]:
    best = None
    for seq_first in (True, False):
        batch_sizes, seq_sizes = [int(batch.max())], [int(seq.max())]
        cost = np.inf
        for _ in range(rounds):
            if seq_first:
                seq_sizes = breakpoint_table(seq, pad_to(batch, batch_sizes), k_seq)[-1][1]
                batch_sizes = breakpoint_table(batch, pad_to(seq, seq_sizes), k_batch)[-1][1]
            else:
                batch_sizes = breakpoint_table(batch, pad_to(seq, seq_sizes), k_batch)[-1][1]
                seq_sizes = breakpoint_table(seq, pad_to(batch, batch_sizes), k_seq)[-1][1]
            new = float((pad_to(batch, batch_sizes) * pad_to(seq, seq_sizes)).sum())
            if new >= cost:
                break
            cost = new
        if best is None or cost < best[0]:
            best = (cost, batch_sizes, seq_sizes)
    return best


# -- the whole set within the budget ----------------------------------------------------------
@dataclass
class Plan:
    sizes: dict[str, list[int]]
    cost: float  # padded tokens + block_weight * block_size * padded blocks


@dataclass
class _Limits:
    block_size: int
    max_tokens: int
    mixed: bool
    block_cost: float  # token-equivalents of one padded block


def plan_buckets(
    workload: Workload,
    max_shapes: int,
    block_size: int,
    max_tokens: int,
    mixed: bool,
    block_weight: float,
    unobserved: Mapping[str, list[int]],
) -> Plan:
    """The cheapest set whose warmup count is <= max_shapes and under which every observed
    step fits a prepared, warmed bucket. An axis with no observed step gets its
    `unobserved` sizes. A ValueError says when no set fits the budget."""
    limits = _Limits(block_size, max_tokens, mixed, block_weight * block_size)
    values = workload.axis_values()
    tables = {
        name: _axis_table(values[name], max_shapes, unobserved.get(name))
        for name in ("prefill_blocks", "decode_batch", "decode_blocks")
    }
    for name in BLOCK_AXES:  # each block padding adds costs block_cost; a padded row, one token
        own = float(values[name].sum())
        tables[name] = [((c - own) * limits.block_cost, s) for c, s in tables[name]]
    best: Plan | None = None
    for pair in _prefill_pairs(workload, max_shapes, unobserved, limits):
        plan = _best_with_pair(workload, pair, tables, max_shapes, limits)
        if plan is not None and (best is None or plan.cost < best.cost):
            best = plan
    if best is None:
        raise ValueError(
            f"no bucket set covers these steps within {max_shapes} warmup shapes: raise "
            "--max-shapes"
        )
    return best


def _axis_table(
    values: np.ndarray, k_max: int, fallback: list[int] | None
) -> list[tuple[float, list[int]]]:
    if not values.size:
        return [(0.0, list(fallback))]
    return breakpoint_table(values, np.ones(values.size), k_max)


def _prefill_pairs(
    workload: Workload, max_shapes: int, unobserved: Mapping[str, list[int]], limits: _Limits
) -> Iterable[tuple[float, list[int], list[int]]]:
    """Every (batch, seq) pair plan whose padded steps stay within the token budget (the
    ones that can be warmed), by sizes per axis."""
    batch, seq = workload.prefill[:, 0], workload.prefill[:, 1]
    if not batch.size:
        yield 0.0, list(unobserved["prefill_batch"]), list(unobserved["prefill_seq"])
        return
    warmable = batch * seq <= limits.max_tokens
    for k_batch in range(1, np.unique(batch).size + 1):
        for k_seq in range(1, np.unique(seq).size + 1):
            if k_batch * k_seq > max_shapes * 4:  # the token filter halves a grid at most
                break
            cost, batch_sizes, seq_sizes = plan_prefill_pair(batch, seq, k_batch, k_seq)
            padded = pad_to(batch, batch_sizes) * pad_to(seq, seq_sizes)
            if (padded[warmable] <= limits.max_tokens).all():
                yield cost, batch_sizes, seq_sizes


def _best_with_pair(
    workload: Workload,
    pair: tuple[float, list[int], list[int]],
    tables: Mapping[str, list[tuple[float, list[int]]]],
    max_shapes: int,
    limits: _Limits,
) -> Plan | None:
    """The cheapest set with this prefill pair: every prefill_blocks choice whose tables
    are wide enough, then decode batch and blocks sizes filling the rest of the budget."""
    pair_cost, batch_sizes, seq_sizes = pair
    seq, blocks = workload.prefill[:, 1], workload.prefill[:, 2]
    decode_costs = np.array([c for c, _ in tables["decode_batch"]])
    decode_ks = np.arange(1, decode_costs.size + 1)
    mixed = np.array(
        [
            mixed_count(seq_sizes, sizes, limits.max_tokens) if limits.mixed else 0
            for _, sizes in tables["decode_batch"]
        ]
    )
    span_costs = np.array([c for c, _ in tables["decode_blocks"]])
    best: Plan | None = None
    for blocks_cost, blocks_sizes in tables["prefill_blocks"]:
        if (
            seq.size
            and (pad_to(blocks, blocks_sizes) * limits.block_size < pad_to(seq, seq_sizes)).any()
        ):
            continue  # some step's padded table would be narrower than its chunk
        prefill = prefill_count(
            batch_sizes, seq_sizes, blocks_sizes, limits.block_size, limits.max_tokens
        )
        room = max_shapes - prefill - mixed
        k_span = np.minimum(room // decode_ks, span_costs.size)
        ok = k_span >= 1
        if not ok.any():
            continue
        total = decode_costs + span_costs[np.maximum(k_span, 1) - 1]
        i = int(np.argmin(np.where(ok, total, np.inf)))
        cost = pair_cost + blocks_cost + float(total[i])
        if best is None or cost < best.cost:
            sizes = {
                "prefill_batch": batch_sizes,
                "prefill_seq": seq_sizes,
                "prefill_blocks": blocks_sizes,
                "decode_batch": tables["decode_batch"][i][1],
                "decode_blocks": tables["decode_blocks"][int(k_span[i]) - 1][1],
            }
            best = Plan(sizes, cost)
    return best


# -- a set measured on a workload -------------------------------------------------------------
@dataclass
class Evaluation:
    shapes: dict[str, int]  # warmup shapes per phase
    real_tokens: int
    padded_tokens: int
    padded_blocks: int  # blocks added by padding, both parts
    misses: int  # parts beyond the largest prepared size (the engine's bucket_misses)
    unwarmed: int  # prepared-size parts whose shape warmup does not compile

    @property
    def num_shapes(self) -> int:
        return sum(self.shapes.values())

    @property
    def utilization(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def evaluate(
    workload: Workload, buckets: Buckets, block_size: int, max_tokens: int, mixed: bool
) -> Evaluation:
    """What `buckets` does to the observed steps, as the metadata builder pads them (the
    decode blocks as recorded: whether a step spans the pool can depend on the set)."""
    sizes = {name: values.tolist() for name, values in buckets.sizes.items()}
    padded_tokens = padded_blocks = misses = unwarmed = 0
    for b, s, m in workload.prefill.tolist():
        (pb, ps, pm), hit = buckets.pad("prefill", {"batch": b, "seq": s, "blocks": m})
        padded_tokens += pb * ps
        padded_blocks += pm - m
        misses += not hit
        unwarmed += hit and (pb * ps > max_tokens or pm * block_size < ps)
    for b, m in workload.decode.tolist():
        (pb, pm), hit = buckets.pad("decode", {"batch": b, "blocks": m})
        padded_tokens += pb
        padded_blocks += pm - m
        misses += not hit
    return Evaluation(
        shapes=warmup_counts(sizes, block_size, max_tokens, mixed),
        real_tokens=workload.real_tokens,
        padded_tokens=padded_tokens,
        padded_blocks=padded_blocks,
        misses=misses,
        unwarmed=unwarmed,
    )
