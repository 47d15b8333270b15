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

from stages.arithmetic import ceil_div
from stages.forward.buckets import (
    Buckets,
    StepRule,
    decode_count,
    is_warmed,
    prefill_count,
    warmup_counts,
)

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
HEADROOM = 0.2  # --headroom: one size this far past an axis's observed maximum


@dataclass
class Plan:
    sizes: dict[str, list[int]]
    cost: float  # padded tokens + block_weight * block_size * padded blocks


def tail_sizes(values: np.ndarray, limit: int, step: int, headroom: float) -> list[int]:
    """The sizes an axis keeps above its observed values: one `headroom` past their
    maximum (rounded up to `step`), then doubling up to the axis limit the config allows,
    so that a step a little past the observed ones pads modestly, one far past pads at
    most twofold (a single jump to the limit padded a 1,852-block decode to 10,240), and
    none pads beyond every size."""
    top = int(values.max()) if values.size else 0
    sizes = []
    if headroom > 0 and top:
        above = max(top + step, ceil_div(math.ceil(top * (1 + headroom)), step) * step)
        while above < limit:
            sizes.append(above)
            above = ceil_div(2 * above, step) * step
    return [*sizes, limit] if limit > top else sizes


def plan_buckets(
    workload: Workload,
    max_shapes: int,
    rule: StepRule,
    block_weight: float,
    limits: Mapping[str, int] | None = None,
    headroom: float = HEADROOM,
    row_weight: float = 1.0,
) -> Plan:
    """The cheapest set whose warmup count is <= max_shapes: the observed values' best
    sizes per axis, then each axis's tail (tail_sizes) up to its limit in `limits`, so
    that every step the config can produce lands on a warmed bucket. Without `limits`,
    the observed steps alone are covered. row_weight: a padded decode row costs this many
    tokens (1: its one token; more where a decode step's time grows with its rows). A
    ValueError says when no set fits the budget."""
    values = workload.axis_values()
    tails = {
        name: tail_sizes(values[name], limits[name], _step(name, rule), headroom) if limits else []
        for name in values
    }
    tables = {
        name: _axis_table(values[name], max_shapes, tails[name])
        for name in ("prefill_blocks", "decode_batch", "decode_blocks")
    }
    tables["decode_batch"] = [(c * row_weight, s) for c, s in tables["decode_batch"]]
    block_cost = block_weight * rule.block_size
    for name in BLOCK_AXES:  # each block padding adds costs block_cost; a padded row, one token
        own = float(values[name].sum())
        tables[name] = [((c - own) * block_cost, s) for c, s in tables[name]]
    decode_counts = _decode_counts(tables)
    best: Plan | None = None
    for pair in _prefill_pairs(workload, max_shapes, tails):
        plan = _best_with_pair(pair, tables, decode_counts, max_shapes, rule)
        if plan is not None and (best is None or plan.cost < best.cost):
            best = plan
    if best is None:
        raise ValueError(_no_fit(max_shapes, tails, rule))
    return best


def _step(name: str, rule: StepRule) -> int:
    return rule.block_size if name == "prefill_seq" else 1


def _no_fit(max_shapes: int, tails: Mapping[str, list[int]], rule: StepRule) -> str:
    """Why no set fits: the least count with the tails alone, when they are given."""
    if not any(tails.values()):
        return (
            f"no bucket set covers these steps within {max_shapes} warmup shapes: "
            "raise --max-shapes"
        )
    least = sum(
        warmup_counts(
            {n: t or [1] for n, t in tails.items()},
            rule.block_size,
            rule.max_tokens,
            rule.mixed,
            rule.padded_budget,
        ).values()
    )
    tops = ", ".join(f"{n} up to {t[-1]}" for n, t in tails.items() if t)
    return (
        f"no bucket set within {max_shapes} warmup shapes covers what the config allows "
        f"({tops}; {least} or more shapes with the observed ones): raise --max-shapes, or "
        "lower the limit behind the widest axis (max_num_seqs for the batch axes, "
        "max_tokens for prefill_seq, max_model_len for the block axes)"
    )


def _axis_table(values: np.ndarray, k_max: int, tail: list[int]) -> list[tuple[float, list[int]]]:
    """By observed sizes k = 1...: (their cost, the k sizes then the tail)."""
    if not values.size:
        return [(0.0, list(tail))]
    return [(c, [*s, *tail]) for c, s in breakpoint_table(values, np.ones(values.size), k_max)]


def _prefill_pairs(
    workload: Workload, max_shapes: int, tails: Mapping[str, list[int]]
) -> Iterable[tuple[float, list[int], list[int]]]:
    """Every (batch, seq) pair plan, by sizes per axis, each with its tails. Every
    observed step pads to a shape warmup compiles (the warmup grid is what steps can
    reach), so no pair is ruled out by the budget."""
    batch, seq = workload.prefill[:, 0], workload.prefill[:, 1]
    tail_b, tail_s = tails["prefill_batch"], tails["prefill_seq"]
    if not batch.size:
        yield 0.0, list(tail_b) or [1], list(tail_s) or [1]
        return
    for k_batch in range(1, np.unique(batch).size + 1):
        for k_seq in range(1, np.unique(seq).size + 1):
            if k_batch * k_seq > max_shapes * 4:  # the token filter halves a grid at most
                break
            cost, batch_sizes, seq_sizes = plan_prefill_pair(batch, seq, k_batch, k_seq)
            yield cost, [*batch_sizes, *tail_b], [*seq_sizes, *tail_s]


def _best_with_pair(
    pair: tuple[float, list[int], list[int]],
    tables: Mapping[str, list[tuple[float, list[int]]]],
    counts: np.ndarray,  # decode graphs of each (decode batch, decode blocks) choice
    max_shapes: int,
    rule: StepRule,
) -> Plan | None:
    """The cheapest set with this prefill pair: every prefill_blocks choice, then the
    decode batch and blocks sizes filling the rest of the budget."""
    pair_cost, batch_sizes, seq_sizes = pair
    decode_costs = np.array([c for c, _ in tables["decode_batch"]])
    span_costs = np.array([c for c, _ in tables["decode_blocks"]])
    best: Plan | None = None
    for blocks_cost, blocks_sizes in tables["prefill_blocks"]:
        prefill = prefill_count(
            batch_sizes, seq_sizes, blocks_sizes, rule.block_size, rule.max_tokens,
            rule.padded_budget,
        )  # fmt: skip
        fits = counts <= max_shapes - prefill
        if not fits.any():
            continue
        span = np.where(fits, span_costs[None, :], np.inf)
        j = np.argmin(span, axis=1)
        total = decode_costs + span[np.arange(j.size), j]
        for i in np.argsort(total):
            cost = pair_cost + blocks_cost + float(total[i])
            if not np.isfinite(total[i]) or (best is not None and cost >= best.cost):
                break
            sizes = {
                "prefill_batch": batch_sizes,
                "prefill_seq": seq_sizes,
                "prefill_blocks": blocks_sizes,
                "decode_batch": tables["decode_batch"][i][1],
                "decode_blocks": tables["decode_blocks"][int(j[i])][1],
            }
            graphs = warmup_counts(
                sizes, rule.block_size, rule.max_tokens, rule.mixed, rule.padded_budget
            )
            if sum(graphs.values()) <= max_shapes:  # the mixed grid's own graphs, if any
                best = Plan(sizes, cost)
                break
    return best


def _decode_counts(tables: Mapping[str, list[tuple[float, list[int]]]]) -> np.ndarray:
    """The decode warmup graphs of every (decode batch, decode blocks) choice."""
    return np.array(
        [
            [decode_count(batch, blocks) for _, blocks in tables["decode_blocks"]]
            for _, batch in tables["decode_batch"]
        ]
    ).reshape(len(tables["decode_batch"]), len(tables["decode_blocks"]))


# -- a set measured on a workload -------------------------------------------------------------
@dataclass
class Evaluation:
    shapes: dict[str, int]  # warmup shapes per phase
    real_tokens: int
    padded_tokens: int
    padded_blocks: int  # blocks added by padding, both parts
    misses: int  # parts beyond the largest prepared size (the engine's bucket_misses)
    unwarmed: int  # prepared-size parts whose shape warmup does not compile (0 by design)

    @property
    def num_shapes(self) -> int:
        return sum(self.shapes.values())

    @property
    def utilization(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def evaluate(workload: Workload, buckets: Buckets, rule: StepRule) -> Evaluation:
    """What `buckets` does to the observed steps, as the metadata builder pads them (the
    decode blocks as recorded: whether a step spans the pool can depend on the set)."""
    sizes = {name: values.tolist() for name, values in buckets.sizes.items()}
    padded_tokens = padded_blocks = misses = unwarmed = 0
    for b, s, m in workload.prefill.tolist():
        shape, hit = buckets.pad("prefill", {"batch": b, "seq": s, "blocks": m})
        padded_tokens += shape[0] * shape[1]
        padded_blocks += shape[2] - m
        misses += not hit
        unwarmed += hit and not is_warmed("prefill", shape, sizes, rule)
    for b, m in workload.decode.tolist():
        shape, hit = buckets.pad("decode", {"batch": b, "blocks": m})
        padded_tokens += shape[0]
        padded_blocks += shape[1] - m
        misses += not hit
        unwarmed += hit and not is_warmed("decode", shape, sizes, rule)
    return Evaluation(
        shapes=warmup_counts(
            sizes, rule.block_size, rule.max_tokens, rule.mixed, rule.padded_budget
        ),
        real_tokens=workload.real_tokens,
        padded_tokens=padded_tokens,
        padded_blocks=padded_blocks,
        misses=misses,
        unwarmed=unwarmed,
    )
