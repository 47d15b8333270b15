"""The bucket plan's report.md: the plan against the config's linear and exponential sets,
on the recorded steps and as served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.buckets.serving import Served
from pipeline.buckets.sources import RunLimits
from pipeline.buckets.speed import Choice, rank
from pipeline.run_folder.reader import read_metrics
from stages.forward.bucket_axes import AXES
from stages.forward.bucket_planner import Evaluation
from stages.forward.buckets import Buckets


def _row(label: str, e: Evaluation, served: list[Served], chosen: str) -> str:
    phases = " / ".join(str(e.shapes.get(p, 0)) for p in ("prefill", "decode", "mixed"))
    measured = (
        f"{sum(s.bucket_misses for s in served)} | {sum(s.serving_compiles for s in served)}"
        if label == chosen and served
        else "not served | not served"
    )
    return (
        f"| {label} | {e.num_shapes} ({phases}) | {e.utilization:.3f} | {e.padded_tokens} | "
        f"{e.padded_blocks} | {measured} | {e.misses} |"
    )


def report(
    source: Path,
    runs: list[Path],
    steps: list[dict[str, Any]],
    limits: RunLimits,
    block_weight: float,
    usage: str,
    sets: dict[str, Buckets],
    results: dict[str, Evaluation],
    served: list[Served],
    chosen: str,
) -> str:
    tops = ", ".join(f"{axis} {top}" for axis, top in limits.tops.items())
    phase = _mixed_phase(limits, results)
    lines = [
        "# Bucket plan",
        "",
        f"From `{source}`: {len(runs)} run(s), {len(steps)} steps; block_size "
        f"{limits.block_size}, max_tokens {limits.max_tokens}, {phase}. The recommended "
        f"set is `{chosen}`. Each axis of a planned set ends at the largest "
        f"value the config allows ({tops}), so no step the config can make misses.",
        *_stalled(runs),
        "",
        f"Use: `{usage}`",
        "",
        "| set | warmup shapes (prefill / decode / mixed) | token utilization | padded "
        "tokens | padded blocks | misses (served) | compiles while serving | misses on the "
        "recorded steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(_row(label, e, served, chosen) for label, e in results.items()),
        "",
        "Warmup shapes are the graphs warmup compiles, counted as the run counts them "
        "(metrics.json's warmup_shapes; the served table below shows each set's run): every "
        "bucket some step can pad to. Token utilization is real tokens over padded tokens "
        "(prefill rows x seq plus decode rows) on the recorded steps. The plan minimises "
        "padded tokens plus block_weight x block_size per padded block (block_weight "
        f"{block_weight}): a padded block is block_size KV slots read for nothing. Misses "
        "(served) and compiles while serving are measured: the plan served, warmed, on the "
        "simulated device (below). Misses on the recorded steps are parts beyond an axis's "
        "largest size on the source's steps.",
        "",
        *_served_table(served),
        "| axis | " + " | ".join(sets) + " |",
        "| --- |" + " --- |" * len(sets),
    ]
    for axis in AXES:
        cells = [_sizes_cell(sets[label].sizes[axis].tolist()) for label in sets]
        lines.append(f"| {axis} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mixed_phase(limits: RunLimits, results: dict[str, Evaluation]) -> str:
    """The mixed warmup phase as it is: present with chunked prefill, and how many graphs
    it adds (often none: its parts are the prefill and decode phases' own)."""
    if not limits.mixed:
        return "no mixed warmup phase"
    mixed = max(e.shapes.get("mixed", 0) for e in results.values())
    return (
        f"a mixed warmup phase (chunked prefill) adding {mixed or 'no'} graphs the prefill "
        "and decode phases do not hold" + (" at most" if mixed else "")
    )


def speed_report(candidates: list[Served], choice: Choice | None, chosen: str) -> str:
    """Each set served on the workload, fastest first, and the recommendation."""
    if choice is None:
        return f"\nNot served, so not ranked by speed: `{chosen}` is the least padding.\n"
    rows = [
        f"| {s.label} | {s.warmup_shapes:,} | {s.warmup_s / 3600:.2f} | {s.throughput:,.1f} | "
        f"{s.ttft_ms[0]:,.0f} / {s.ttft_ms[1]:,.0f} | {s.tpot_ms[0]:.1f} / {s.tpot_ms[1]:.1f} "
        f"| {s.duration_s:,.1f} | {s.bucket_misses} | {s.serving_compiles} | "
        f"{s.token_utilization:.3f} |"
        for s in sorted(candidates, key=rank)
    ]
    return "\n".join([
        "",
        "## Each set served on the workload (fastest first)",
        "",
        "Graphs and warmup here are this tool's grids (warmup compiles every bucket some step "
        "can pad to), not an engine's own: FastDeploy warms its own grid from its environment "
        "(simulate it with metadata.bucketing=fastdeploy; python -m pipeline.deploy states its "
        "recipes), vllm-gaudi takes a set like these from VLLM_BUCKETING_FROM_FILE.",
        "",
        "Candidates `bB` and `bBrR` are the least-padding sets at block weight B (and a "
        "padded decode row weighing R tokens); `linear` and `exponential` the config's "
        "built-in sets. Each is served warmed on the simulated device; the recommendation "
        "must be no slower than the reference built-in (serve time, TTFT p90, TPOT p90, "
        "within 1%) with no more graphs.",
        "",
        "| set | graphs | warmup h | output tok/s | TTFT p50 / p90 ms | TPOT p50 / p90 ms | "
        "serve s | misses | compiles while serving | token utilization |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Recommended: `{choice.chosen.label}`: {choice.reason}.",
        "",
    ])  # fmt: skip


def _served_table(served: list[Served]) -> list[str]:
    if not served:
        return [
            "Not served: the source folders keep no overrides (.hydra/overrides.yaml); "
            "serve the plan with the usage line above and read bucket_misses.",
            "",
        ]
    rows = [
        f"| {s.label} | `{' '.join(s.overrides)}` | {s.bucket_misses} | {s.serving_compiles} "
        f"| {s.token_utilization:.3f} | {s.warmup_shapes} |"
        for s in served
    ]
    return [
        "Served with the plan (folders `served-LABEL` beside this report):",
        "",
        "| served | overrides | bucket misses | compiles while serving | token utilization | "
        "warmup shapes |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]


def _stalled(runs: list[Path]) -> list[str]:
    """A warning for each source run that compiled graphs while serving: its steps were
    stalled by compiles, so its schedule is not the one a warmed deployment makes."""
    lines = []
    for run in runs:
        metrics = read_metrics(run) or {}
        if metrics.get("serving_compiles"):
            lines.append(
                f"Warning: `{run}` compiled {metrics['serving_compiles']} graphs while serving "
                "(warmup off, or misses): compile stalls shaped its steps; plan from a run "
                "with warmup=true, or with --workload (which warms up)."
            )
    return ["", *lines] if lines else []


def _sizes_cell(sizes: list[int]) -> str:
    shown = sizes if len(sizes) <= 12 else [*sizes[:5], "...", *sizes[-3:]]
    return f"{len(sizes)}: " + ", ".join(map(str, shown))
