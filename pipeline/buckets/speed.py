"""Planning for speed: candidate bucket sets served on the simulated device (the real
scheduler on shapes alone), ranked by the workload's serving time, and a recommendation
that is never slower than the best built-in set at no more graphs.

Candidates come from the padding planner (stages/forward/bucket_planner.py) at several block
weights: padded blocks cost attention time that padded tokens alone do not price, so the
utilization optimum is one candidate, not the answer. Each is served; the figures decide.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cmp_to_key
from pathlib import Path

from pipeline.buckets.serving import Served
from pipeline.run_folder.run_files import write_file
from stages.forward.bucket_planner import Plan, Workload, plan_buckets
from stages.forward.buckets import StepRule

# figures within 1% are equal: a candidate 0.5% slower than the reference is not slower
TOLERANCE = 0.01
# (block weight, row weight) tried beside the given block weight: a padded block as 1% or
# 10% of block_size tokens (0.001, the default, is its FLOPs share at a large hidden
# size), a padded decode row as 1 token or as 64 (a decode step's time grows with its
# rows more than padding by tokens says: the utilization optimum keeps one decode batch)
WEIGHTS = ((0.01, 1.0), (0.1, 1.0), (0.001, 64.0), (0.01, 64.0), (0.1, 64.0))


def _figures_of(s: Served) -> tuple[float, float, float]:
    return (s.duration_s, s.ttft_ms[1], s.tpot_ms[1])


def _compare(a: Served, b: Served) -> int:
    """-1 when `a` is faster: by the time to serve the workload, then (that within the
    tolerance: an arrival-bound workload's time ties) TTFT p90, then TPOT p90."""
    for x, y in zip(_figures_of(a), _figures_of(b), strict=True):
        if abs(x - y) > TOLERANCE * max(abs(x), abs(y)):
            return -1 if x < y else 1
    return 0


rank = cmp_to_key(_compare)  # sort key: faster first


def not_slower(a: Served, b: Served, tolerance: float = TOLERANCE) -> bool:
    """Whether `a` serves the workload as fast as `b` on every figure (time, TTFT p90,
    TPOT p90), within the tolerance, with no more bucket misses."""
    return (
        a.duration_s <= b.duration_s * (1 + tolerance)
        and a.ttft_ms[1] <= b.ttft_ms[1] * (1 + tolerance)
        and a.tpot_ms[1] <= b.tpot_ms[1] * (1 + tolerance)
        and a.bucket_misses <= b.bucket_misses
    )


@dataclass
class Choice:
    """The recommended set and why."""

    chosen: Served
    reference: Served  # the built-in set it had to match
    planned: bool  # a planned set, or the built-in reference itself (the fallback)
    reason: str


def choose(candidates: list[Served], builtins: list[Served], budget: int) -> Choice:
    """The fastest candidate with no more graphs than the reference and not slower than
    it; the reference is the fastest built-in within the graph budget. Without such a
    candidate: the reference; with no built-in within the budget, the fastest set that is.
    The budget is a hard limit: no set past it is recommended, and the reason says what it
    costs against the fastest set beyond it."""
    within = [b for b in builtins if b.warmup_shapes <= budget]
    if not within:
        return _within_budget(candidates, builtins, budget)
    reference, which = min(within, key=rank), f"the fastest built-in within {budget} graphs"
    fits = [
        c for c in candidates
        if c.warmup_shapes <= reference.warmup_shapes and not_slower(c, reference)
    ]  # fmt: skip
    if not fits:
        return Choice(reference, reference, False, (
            f"no planned set served as fast as {reference.label}, {which}, with no more "
            f"graphs: recommending {reference.label} itself ({_figures(reference)})"
        ) + _beyond(reference, [*candidates, *builtins]))  # fmt: skip
    best = min(sorted(fits, key=lambda c: c.warmup_shapes), key=rank)  # ties: fewer graphs
    return Choice(best, reference, True, (
        f"{best.label} ({_figures(best)}) is not slower than {reference.label}, {which} "
        f"({_figures(reference)}), with no more graphs"
    ) + _beyond(best, [*candidates, *builtins]))  # fmt: skip


def _within_budget(candidates: list[Served], builtins: list[Served], budget: int) -> Choice:
    """No built-in fits the budget: the fastest planned set within it (the planner keeps
    every candidate within it); none at all is an error, never a set past the budget."""
    fits = [c for c in candidates if c.warmup_shapes <= budget]
    if not fits:
        fewest = min(builtins, key=lambda b: b.warmup_shapes)
        raise ValueError(
            f"no bucket set fits --max-shapes {budget}: the smallest built-in, "
            f"{fewest.label}, has {fewest.warmup_shapes:,} graphs; raise --max-shapes"
        )
    best = min(sorted(fits, key=lambda c: c.warmup_shapes), key=rank)
    return Choice(best, best, True, (
        f"no built-in fits {budget} graphs; {best.label} ({_figures(best)}) is the fastest "
        "planned set within them"
    ) + _beyond(best, [*candidates, *builtins]))  # fmt: skip


def _beyond(chosen: Served, every: list[Served]) -> str:
    """What the budget costs: the fastest set of all against the one recommended."""
    fastest = min(every, key=rank)
    if fastest is chosen or fastest.warmup_shapes <= chosen.warmup_shapes:
        return ""
    slower = chosen.duration_s / fastest.duration_s - 1 if fastest.duration_s else 0.0
    return (
        f"; the budget costs {slower:.1%} serving time against the fastest set beyond it, "
        f"{fastest.label} ({_figures(fastest)})"
    )


def _figures(s: Served) -> str:
    return (
        f"{s.warmup_shapes:,} graphs, {s.throughput:,.1f} tok/s, TTFT p90 "
        f"{s.ttft_ms[1]:,.0f} ms, TPOT p90 {s.tpot_ms[1]:.1f} ms"
    )


def candidate_plans(
    workload: Workload,
    max_shapes: int,
    rule: StepRule,
    block_weight: float,
    tops: dict[str, int],
    headroom: float,
) -> dict[str, Plan]:
    """Padding-optimal sets at the given block weight and at WEIGHTS, distinct sets only,
    labelled by their weights ("b0.001" for block weight 0.001, "b0.01r64" with a row
    weight of 64)."""
    plans: dict[str, Plan] = {}
    for blocks, rows in dict.fromkeys(((block_weight, 1.0), *WEIGHTS)):
        plan = plan_buckets(workload, max_shapes, rule, blocks, tops, headroom, rows)
        if all(plan.sizes != p.sizes for p in plans.values()):
            plans[f"b{blocks:g}" + (f"r{rows:g}" if rows != 1 else "")] = plan
    return plans


def write_choice(
    path: Path, served: list[Served], choice: Choice | None, label: str, budget: int
) -> None:
    """choice.json: every set served and the recommendation, for scripts and benchmarks."""
    sets = [
        {
            "set": s.label,
            "graphs": s.warmup_shapes,
            "warmup_s": s.warmup_s,
            "throughput": s.throughput,
            "ttft_p50_ms": s.ttft_ms[0],
            "ttft_p90_ms": s.ttft_ms[1],
            "tpot_p50_ms": s.tpot_ms[0],
            "tpot_p90_ms": s.tpot_ms[1],
            "serve_s": s.duration_s,
            "misses": s.bucket_misses,
            "compiles": s.serving_compiles,
            "utilization": s.token_utilization,
        }  # fmt: skip
        for s in sorted(served, key=rank)
    ]
    document = {
        "budget": budget,
        "recommended": label,
        "planned": bool(choice and choice.planned),
        "reference": choice.reference.label if choice else None,
        "reason": choice.reason if choice else "not served",
        "sets": sets,
    }
    write_file(path, json.dumps(document, indent=2) + "\n")
