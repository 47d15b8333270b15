"""A bucket plan for a FastDeploy run: FastDeploy's own step variables (MAX_PREFILL_NUM,
BATCH_STEP_PREFILL, SEQUENCE_STEP_PREFILL, CONTEXT_BLOCK_STEP_PREFILL, BATCH_STEP_DECODE,
BLOCK_STEP_DECODE) and HPU_WARMUP_MODEL_LEN, not bucket sizes: FastDeploy warms the grid
its environment gives (stages/forward/engine_grids.py), so that environment is what a plan
can change.

The search starts from FastDeploy's defaults (or, where they exceed the budget, from the
largest grid within it) and changes one variable at a time; every set tried is served on
the recorded workload (engine=fastdeploy on the simulated device), and a change is kept
where it compiles fewer shapes while serving, then serves faster, then warms fewer recipe
sets. The budget (--max-shapes, --max-warmup) is a hard limit: the recommendation is the
best set within it, and the report says what it costs against the best set served beyond.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipeline.buckets.serving import Served, serve_set
from pipeline.buckets.speed import TOLERANCE
from pipeline.run_folder.reader import RESOLVED_CONFIG, read_mapping, read_metrics, read_step_lines
from pipeline.run_folder.run_files import output_folder, write_file
from stages.forward.buckets import Bucketing
from stages.forward.engine_grids import (
    FastDeploySteps,
    ServerLimits,
    fastdeploy_warmup,
    part_graphs,
)

# The variables a plan changes, as metadata.fastdeploy names them, in the order it tries them
# (the grid's size first: the model length and the decode steps make most of its recipes).
KNOBS = (
    "warmup_model_len",
    "batch_step_decode",
    "block_step_decode",
    "max_prefill_num",
    "sequence_step_prefill",
    "batch_step_prefill",
    "context_block_step_prefill",
)
ENV = FastDeploySteps().env()  # each knob's environment name, by the order of its fields
NAMES = dict(zip([f.name for f in fields(FastDeploySteps)], ENV, strict=False))


def is_fastdeploy_run(run: Path) -> bool:
    """Whether the run simulated FastDeploy's grid (engine=fastdeploy, or its bucketing)."""
    config = read_mapping(run / RESOLVED_CONFIG) or {}
    meta = config.get("metadata") or {}
    return meta.get("bucketing") == Bucketing.fastdeploy.value


@dataclass
class Tried:
    """One set of step variables, its recipe sets (listed from FastDeploy's warmup loops)
    and its serving on the workload."""

    label: str
    steps: FastDeploySteps
    recipes: int
    served: Served | None = None

    def overrides(self) -> list[str]:
        return [f"metadata.fastdeploy.{k}={getattr(self.steps, k)}" for k in KNOBS]

    def key(self, budget: int) -> tuple:
        """The order of preference: within the budget, fewest compiles while serving,
        shortest serving, fewest recipe sets."""
        s = self.served
        assert s is not None, "serve it first"
        return (self.recipes > budget, s.serving_compiles, round(s.duration_s, 3), self.recipes)


def server_limits(run: Path) -> tuple[ServerLimits, FastDeploySteps]:
    """The server limits FastDeploy's warmup reads, from the run's resolved config and its
    pool, and FastDeploy's default steps at its block size."""
    config = read_mapping(run / RESOLVED_CONFIG) or {}
    blocks = int((read_metrics(run) or {}).get("num_blocks") or 0)
    scheduler = str((config.get("scheduler") or {}).get("_target_", ""))
    block_size = int(config["block_size"])
    limits = ServerLimits(
        block_size, int(config["max_tokens"]), int(config["max_num_seqs"]),
        int(config["max_model_len"]), blocks, bool(config.get("prefix_caching", True)),
        scheduler.endswith("ChunkedScheduler"),
    )  # fmt: skip
    return limits, FastDeploySteps(sequence_step_prefill=block_size)


def recipe_sets(steps: FastDeploySteps, limits: ServerLimits) -> int:
    """The recipe sets FastDeploy's warmup compiles for these steps (engine_grids)."""
    return sum(part_graphs(fastdeploy_warmup(steps, limits), whole=True).values())


def sequence_lengths(run: Path) -> list[int]:
    """Every request's longest length in the run's steps (prompt and output so far)."""
    longest: dict[str, int] = {}
    for step in read_step_lines(run / "steps.jsonl"):
        for chunk in step.get("prefill") or []:
            longest[chunk["id"]] = max(longest.get(chunk["id"], 0), int(chunk["end"]))
        for rid, n in zip(step.get("decode") or [], step.get("decode_lens") or [], strict=False):
            longest[rid] = max(longest.get(rid, 0), int(n))
    return sorted(longest.values())


def knob_values(limits: ServerLimits, lengths: list[int]) -> dict[str, list[int]]:
    """The values tried for each variable: the model length at FastDeploy's default, at
    the workload's 90th percentile and longest sequence (whole blocks, at most
    max_model_len); the steps at and around FastDeploy's defaults."""
    bs, top = limits.block_size, limits.max_model_len

    def blocks(n: int) -> int:
        return min(top, max(bs, -(-n // bs) * bs))

    p90 = lengths[int(0.9 * (len(lengths) - 1))] if lengths else top
    longest = lengths[-1] if lengths else top
    return {
        "warmup_model_len": sorted({blocks(4096), blocks(p90), blocks(longest)}),
        "batch_step_decode": [2, 4, 8, 16, 32],
        "block_step_decode": [8, 16, 32, 64, 128],
        "max_prefill_num": [1, 2, 3],
        "sequence_step_prefill": [bs, 2 * bs],
        "batch_step_prefill": [1],  # a coarser step warms no batch of 1: never better
        # context steps only matter with prefix caching (its warmup's context loop)
        "context_block_step_prefill": [1, 2, 4] if limits.prefix_caching else [1],
    }


def start_within(
    defaults: FastDeploySteps, limits: ServerLimits, values: dict[str, list[int]], budget: int
) -> FastDeploySteps:
    """FastDeploy's defaults where they fit the budget; else the grid within it with the
    most recipe sets (coarser decode steps, a shorter model length, fewer prefill rows);
    a ValueError when even the smallest does not fit."""
    if recipe_sets(defaults, limits) <= budget:
        return defaults
    axes = ("warmup_model_len", "batch_step_decode", "block_step_decode", "max_prefill_num")
    # the other variables at their coarsest (the search refines them back where it pays)
    coarse = replace(defaults, **{k: max(values[k]) for k in KNOBS if k not in axes})
    best, fewest = None, None
    for combo in itertools.product(*(values[a] for a in axes)):
        steps = replace(coarse, **dict(zip(axes, combo, strict=True)))
        n = recipe_sets(steps, limits)
        if fewest is None or n < fewest:
            fewest = n
        if n <= budget and (best is None or n > best[0]):
            best = (n, steps)
    if best is None:
        raise ValueError(
            f"no FastDeploy step variables fit --max-shapes {budget}: the fewest tried "
            f"warm {fewest:,} recipe sets; raise --max-shapes (or --max-warmup)"
        )
    return best[1]


def label_of(steps: FastDeploySteps, defaults: FastDeploySteps) -> str:
    """The variables that differ from FastDeploy's defaults, e.g. `BLOCK_STEP_DECODE=32`."""
    changed = [f"{NAMES[k]}={getattr(steps, k)}" for k in KNOBS
               if getattr(steps, k) != getattr(defaults, k)]  # fmt: skip
    return " ".join(changed) or "defaults"


def search(
    run: Path, overrides: list[str], out: Path, budget: int
) -> tuple[list[Tried], Tried, Tried]:
    """Every set served, FastDeploy's defaults, and the recommendation within the budget."""
    limits, defaults = server_limits(run)
    values = knob_values(limits, sequence_lengths(run))
    tried: dict[FastDeploySteps, Tried] = {}

    def serve(steps: FastDeploySteps) -> Tried:
        if steps not in tried:
            t = Tried(label_of(steps, defaults), steps, recipe_sets(steps, limits))
            folder = out / f"fd-{len(tried)}"
            t.served = serve_set(overrides, t.overrides(), folder, t.label)
            tried[steps] = t
        return tried[steps]

    base = serve(defaults)
    current = serve(start_within(defaults, limits, values, budget))
    for knob in KNOBS:
        for value in values[knob]:
            steps = replace(current.steps, **{knob: value})
            if steps.batch_step_prefill > steps.max_prefill_num:
                continue  # its warmup would hold no prefill batch
            candidate = serve(steps)
            if candidate.key(budget) < current.key(budget):
                current = candidate
    return list(tried.values()), base, current


def best_beyond(tried: list[Tried], budget: int) -> Tried | None:
    """The best set served past the budget, where it is better than every one within."""
    beyond = [t for t in tried if t.recipes > budget]
    return min(beyond, key=lambda t: t.key(budget)[1:]) if beyond else None


def env_lines(steps: FastDeploySteps) -> list[str]:
    return [f"export {name}={value}" for name, value in steps.env().items()]


def bucket_file(steps: FastDeploySteps, header: str, usage: str) -> str:
    """A config file that sets these variables: metadata.fastdeploy.*."""
    values = "".join(f"    {k}: {getattr(steps, k)}\n" for k in KNOBS)
    return f"# @package _global_\n# {header}\n# Use: {usage}\nmetadata:\n  fastdeploy:\n{values}"


def as_choice(tried: list[Tried], chosen: Tried, budget: int, reason: str) -> dict[str, Any]:
    """choice.json's document: each set served and the recommendation."""
    sets = []
    for t in sorted(tried, key=lambda t: t.key(budget)):
        s = t.served
        assert s is not None
        sets.append({
            "set": t.label, "graphs": t.recipes, "warmup_s": s.warmup_s,
            "throughput": s.throughput, "ttft_p50_ms": s.ttft_ms[0],
            "ttft_p90_ms": s.ttft_ms[1], "tpot_p50_ms": s.tpot_ms[0],
            "tpot_p90_ms": s.tpot_ms[1], "serve_s": s.duration_s, "misses": s.bucket_misses,
            "compiles": s.serving_compiles, "env": t.steps.env(),
        })  # fmt: skip
    return {"budget": budget, "recommended": chosen.label, "planned": True,
            "reference": "defaults", "reason": reason, "sets": sets}  # fmt: skip


def plan_fastdeploy(
    source: Path, run: Path, variants: list[tuple[str, list[str]]], out: Path, name: str,
    budget: int,
) -> dict[str, Any]:  # fmt: skip
    """Searches FastDeploy's step variables on the first variant, writes the recommended
    ones as OUT/buckets/NAME.yaml and OUT/fastdeploy-env.sh, serves them on every variant,
    and writes OUT/report.md; returns choice.json's document."""
    if not variants:
        raise ValueError(f"{source}: the run keeps no overrides to serve it again with; "
                         "plan with --workload OVERRIDES")  # fmt: skip
    tried, base, chosen = search(run, variants[0][1], out, budget)
    beyond = best_beyond(tried, budget)
    usage = f"python -m pipeline hydra.searchpath=[file://{out.resolve()}] +buckets={name}"
    reason = _reason(chosen, base, beyond, budget)
    header = f"FastDeploy's step variables planned within {budget:,} recipe sets: {reason}"
    output_folder(out / "buckets")
    write_file(out / "buckets" / f"{name}.yaml", bucket_file(chosen.steps, header, usage))
    write_file(
        out / "fastdeploy-env.sh", "\n".join([f"# {header}", *env_lines(chosen.steps)]) + "\n"
    )
    served = [serve_set(o, chosen.overrides(), out / f"served-{label}", label)
              for label, o in variants]  # fmt: skip
    write_file(
        out / "report.md", report(source, tried, chosen, base, beyond, budget, served, usage)
    )
    return as_choice(tried, chosen, budget, reason)


def _figures(t: Tried) -> str:
    s = t.served
    assert s is not None
    return (
        f"{t.recipes:,} recipe sets, {s.warmup_s / 3600:.2f} h warmup, {s.throughput:,.1f} "
        f"tok/s, TTFT p90 {s.ttft_ms[1]:,.0f} ms, TPOT p90 {s.tpot_ms[1]:.1f} ms, "
        f"{s.serving_compiles:,} compiles while serving"
    )


def _reason(chosen: Tried, base: Tried, beyond: Tried | None, budget: int) -> str:
    """The recommendation against FastDeploy's defaults, and what the budget costs."""
    text = f"`{chosen.label}` ({_figures(chosen)}); FastDeploy's defaults: {_figures(base)}"
    if chosen.recipes > budget:  # only where nothing was served within it (start_within)
        raise AssertionError("the recommendation exceeds the budget")
    if beyond is None:
        return text + "; every set served fits the budget"
    b, c = beyond.served, chosen.served
    assert b is not None and c is not None
    slower = c.duration_s / b.duration_s - 1 if b.duration_s else 0.0
    fewer = c.serving_compiles - b.serving_compiles
    if fewer <= 0 and slower <= TOLERANCE:
        return text + (f"; the budget costs nothing measurable: the best set served beyond it, "
                       f"`{beyond.label}` ({_figures(beyond)}), serves no better")  # fmt: skip
    text += (
        f"; the budget costs {fewer:,} more compiles while serving and {slower:.1%} serving "
        f"time against the best set served beyond it, `{beyond.label}` ({_figures(beyond)})"
    )
    return text


def report(
    source: Path, tried: list[Tried], chosen: Tried, base: Tried, beyond: Tried | None,
    budget: int, served: list[Served], usage: str,
) -> str:  # fmt: skip
    """The report: each set served on the workload, the recommendation, and the
    recommendation served on each variant."""
    names = [NAMES[k] for k in KNOBS]
    head = f"| set | {' | '.join(names)} | recipe sets | warmup h | output tok/s | " \
           "TTFT p90 ms | TPOT p90 ms | compiles while serving |"  # fmt: skip
    rows = []
    for t in sorted(tried, key=lambda t: t.key(budget)):
        s = t.served
        assert s is not None
        mark = " (recommended)" if t is chosen else " (FastDeploy's)" if t is base else ""
        rows.append(
            f"| {t.label}{mark} | {' | '.join(str(getattr(t.steps, k)) for k in KNOBS)} | "
            f"{t.recipes:,}{' (over)' if t.recipes > budget else ''} | {s.warmup_s / 3600:.2f} "
            f"| {s.throughput:,.1f} | {s.ttft_ms[1]:,.0f} | {s.tpot_ms[1]:.1f} | "
            f"{s.serving_compiles:,} |"
        )
    checks = [
        f"| {s.label} | {s.throughput:,.1f} | {s.ttft_ms[1]:,.0f} | {s.tpot_ms[1]:.1f} | "
        f"{s.serving_compiles:,} |" for s in served
    ]  # fmt: skip
    return "\n".join([
        f"# FastDeploy step variables for {source}", "",
        f"Budget: {budget:,} recipe sets (--max-shapes, --max-warmup). Each set below was "
        "served on the recorded workload with engine=fastdeploy on the simulated device; "
        "a set is preferred with fewer compiles while serving, then a shorter serving "
        "time, then fewer recipe sets.", "",
        head, "| --- " * (len(names) + 6) + "|", *rows, "",
        f"Recommended: {_reason(chosen, base, beyond, budget)}.", "",
        "Environment for fastdeploy-hpu.sh:", "", "```", *env_lines(chosen.steps), "```", "",
        f"Simulate it: `{usage} engine=fastdeploy ...`", "",
        "## The recommendation served on each workload", "",
        "| workload | output tok/s | TTFT p90 ms | TPOT p90 ms | compiles while serving |",
        "| --- | --- | --- | --- | --- |", *checks, "",
    ])  # fmt: skip
