"""`python -m pipeline.buckets`: plan a bucket set from served steps, or show a run's use.

    python -m pipeline.buckets plan RUN_OR_SWEEP --max-shapes 64 --out DIR [--name planned]
    python -m pipeline.buckets plan --workload OVERRIDES... --max-shapes 64 --out DIR
    python -m pipeline.buckets show RUN

With --workload, OVERRIDES are a workload config (any overrides of `python -m pipeline`):
it is served warmed on the simulated device (shapes only, no weights; `hardware=gaudi3`
unless given) into DIR/simulated-run, and the plan is made from those steps.

Every axis of a plan ends at the largest value the config allows (max_num_seqs,
max_tokens, max_model_len and the block pool), with one size --headroom past the
observed maximum, so a step the config can make never misses; a budget that cannot
hold that is refused with the limit to lower.

`plan` writes DIR/buckets/NAME.yaml, a config file used as
`python -m pipeline hydra.searchpath=[file://DIR] +buckets=NAME warmup=true`, serves it
on the simulated device (the planned workload and the next seed; for folders, each run's
own overrides) into DIR/served-*, and writes DIR/report.md: the measured misses and
compiles, and the plan against the config's linear and exponential sets.

example:
    python -m pipeline.buckets plan --workload model=spec/llama31_8b hardware=gaudi2 \\
        workload.num_requests=200 workload.rate=4 --max-shapes 64 --out plans
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from pipeline.buckets.serving import Served, run_overrides, serve_plan, simulated, with_seed
from pipeline.run_folder import read_mapping, read_metrics, read_step_lines
from stages.bucket_planner import HEADROOM, Evaluation, Plan, Workload, evaluate, plan_buckets
from stages.buckets import Axis, Bucketing, Buckets, StepRule
from stages.interfaces import Scheduler
from stages.kv_cache import blocks_for
from stages.metadata import AXES, decode_blocks_limit, resolve_axes
from stages.scheduler import Budget


class SourceError(ValueError):
    """A folder that cannot be planned from; the message says why."""


@dataclass
class RunLimits:
    """What a run's config fixes about its buckets."""

    rule: StepRule  # block size, budget and budget rule, mixed warmup phase
    axes: dict[str, Axis]  # the config's min/step/max, any explicit sizes left out
    tops: dict[str, int]  # the largest value each axis can take under the config

    @property
    def block_size(self) -> int:
        return self.rule.block_size

    @property
    def max_tokens(self) -> int:
        return self.rule.max_tokens

    @property
    def mixed(self) -> bool:
        return self.rule.mixed

    def buckets(
        self, strategy: Bucketing | str, sizes: dict[str, list[int]] | None = None
    ) -> Buckets:
        """The config's set under a strategy, or the explicit `sizes` of every axis."""
        axes = self.axes
        if sizes:
            axes = {
                name: Axis(sizes[name][0], a.step, sizes[name][-1], tuple(sizes[name]))
                for name, a in axes.items()
            }
        return Buckets(strategy, axes)


def find_runs(source: Path) -> list[Path]:
    """The run folder itself, or every job folder under a sweep folder."""
    if (source / "steps.jsonl").is_file():
        return [source]
    runs = sorted(p.parent for p in source.glob("**/steps.jsonl"))
    if not runs:
        raise SourceError(f"{source}: no steps.jsonl here or below; give a run or sweep folder")
    return runs


def read_steps(run: Path) -> list[dict[str, Any]]:
    steps = read_step_lines(run / "steps.jsonl")
    if steps and "needed" not in steps[0]:
        raise SourceError(
            f"{run}/steps.jsonl has no `needed` dims (an older run): serve it again to plan"
        )
    return steps


def _num_blocks(run: Path, cfg: DictConfig) -> int:
    """The block pool the run had: configured, or as derived at start (pipeline.log)."""
    if cfg.num_blocks:
        return int(cfg.num_blocks)
    log = run / "pipeline.log"
    for line in log.read_text(encoding="utf-8").splitlines() if log.is_file() else []:
        if '"pipeline_ready"' in line:
            return int(json.loads(line)["num_blocks"])
    return cfg.max_num_seqs * blocks_for(cfg.max_model_len, cfg.block_size)


def run_limits(run: Path) -> RunLimits:
    path = run / "resolved_config.yaml"
    if not path.is_file():
        raise SourceError(f"{run}: no resolved_config.yaml; give a folder the pipeline wrote")
    cfg = OmegaConf.create(read_mapping(path))
    scheduler: type[Scheduler] = get_class(cfg.scheduler._target_)
    given = {
        name: {key: cfg.metadata[name][key] for key in ("min", "step", "max")} for name in AXES
    }
    num_blocks = _num_blocks(run, cfg)
    prefix = bool(OmegaConf.select(cfg, "prefix_caching", default=False))
    axes = resolve_axes(
        given, cfg.block_size, cfg.max_tokens, cfg.max_num_seqs, cfg.max_model_len, num_blocks,
        prefix,
    )  # fmt: skip
    budget = OmegaConf.select(cfg, "scheduler.budget", default=Budget.padded)
    rule = StepRule(
        block_size=cfg.block_size,
        max_tokens=cfg.max_tokens,
        mixed=bool(scheduler.splits_prompts),
        padded_budget=budget == Budget.padded,
    )
    tops = axis_tops(rule, cfg.max_num_seqs, cfg.max_model_len, num_blocks, prefix)
    return RunLimits(rule=rule, axes=axes, tops=tops)


def axis_tops(
    rule: StepRule, max_num_seqs: int, max_model_len: int, num_blocks: int, prefix: bool
) -> dict[str, int]:
    """The largest value each bucket axis can take under the config: a plan ends every
    axis here, so no step the config allows misses. Prefill rows are at most the budget
    over one row's least cost; a chunk is at most the budget and the model length; with
    prefix caching, rows list their shared blocks each, so decode blocks are bounded by
    rows x a full row's blocks rather than by the pool."""
    bs, budget = rule.block_size, rule.max_tokens
    per_row = blocks_for(max_model_len, bs)
    chunk = budget // bs if rule.padded_budget else blocks_for(budget, bs)
    return {
        "prefill_batch": min(max_num_seqs, budget // bs if rule.padded_budget else budget),
        "prefill_seq": min(chunk, per_row) * bs,
        "prefill_blocks": per_row,
        "decode_batch": min(max_num_seqs, budget),
        "decode_blocks": decode_blocks_limit(max_num_seqs, per_row, num_blocks, prefix),
    }


def load_source(source: Path) -> tuple[list[Path], RunLimits, list[dict[str, Any]]]:
    """(runs, their shared limits, all their steps); runs must agree on the limits."""
    runs = find_runs(source)
    limits = [run_limits(run) for run in runs]
    for key in ("block_size", "max_tokens", "mixed", "padded_budget"):
        if len({getattr(lim.rule, key) for lim in limits}) > 1:
            raise SourceError(
                f"{source}: the jobs differ in {key}; a bucket set serves one config, so "
                "plan from the jobs that share it"
            )
    # the widest limits of any job: the plan serves them all
    tops = {name: max(lim.tops[name] for lim in limits) for name in AXES}
    limits[0].tops = tops
    return runs, limits[0], [step for run in runs for step in read_steps(run)]


# -- plan ------------------------------------------------------------------------------------
def plan_source(
    source: Path,
    max_shapes: int,
    out: Path,
    name: str,
    block_weight: float,
    headroom: bool = True,
    variants: list[tuple[str, list[str]]] | None = None,
) -> tuple[Plan, dict[str, Evaluation]]:
    """Plans from the source's steps, writes the bucket file, serves it on `variants`
    (label, overrides; by default each run's own overrides and the first run's at the next
    seed, where the folders keep them) and writes the report."""
    runs, limits, steps = load_source(source)
    workload = Workload.of(steps)
    plan = plan_buckets(
        workload,
        max_shapes,
        limits.rule,
        block_weight,
        limits=limits.tops,
        headroom=HEADROOM if headroom else 0.0,
    )
    sets = {
        "plan": limits.buckets(Bucketing.linear, plan.sizes),
        "linear": limits.buckets(Bucketing.linear),
        "exponential": limits.buckets(Bucketing.exponential),
    }
    results = {label: evaluate(workload, buckets, limits.rule) for label, buckets in sets.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "buckets").mkdir(exist_ok=True)
    usage = (
        f"python -m pipeline hydra.searchpath=[file://{out.resolve()}] +buckets={name} warmup=true"
    )
    header = (
        f"Planned by python -m pipeline.buckets plan {source} --max-shapes {max_shapes}: "
        f"{results['plan'].num_shapes} warmup shapes, token utilization "
        f"{results['plan'].utilization:.3f} on {len(steps)} steps."
    )
    (out / "buckets" / f"{name}.yaml").write_text(bucket_file(plan.sizes, header, usage))
    if variants is None:
        variants = default_variants(runs)
    served = serve_plan(variants, out, name) if variants else []
    (out / "report.md").write_text(
        report(source, runs, steps, limits, block_weight, usage, sets, results, served)
    )
    return plan, results


def default_variants(runs: list[Path]) -> list[tuple[str, list[str]]]:
    """Each run's own overrides, and the first run's at the next seed (a workload the
    plan never saw); none when a folder keeps no overrides."""
    found = [run_overrides(run) for run in runs]
    if not runs or any(o is None for o in found):
        return []
    variants = [(f"run{i}" if len(runs) > 1 else "same", o or []) for i, o in enumerate(found)]
    first = found[0] or []
    seed = next((int(o.split("=", 1)[1]) for o in first if o.startswith("seed=")), 0)
    return [*variants, (f"seed{seed + 1}", with_seed(first, seed + 1))]


def bucket_file(sizes: dict[str, list[int]], header: str, usage: str) -> str:
    axes = "".join(f"  {axis}: {{sizes: {list(values)}}}\n" for axis, values in sizes.items())
    return f"# @package _global_\n# {header}\n# Use: {usage}\nmetadata:\n{axes}"


def _row(label: str, e: Evaluation, served: list[Served]) -> str:
    phases = " / ".join(str(e.shapes.get(p, 0)) for p in ("prefill", "decode", "mixed"))
    measured = (
        f"{sum(s.bucket_misses for s in served)} | {sum(s.serving_compiles for s in served)}"
        if label == "plan" and served
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
) -> str:
    tops = ", ".join(f"{axis} {top}" for axis, top in limits.tops.items())
    lines = [
        "# Bucket plan",
        "",
        f"From `{source}`: {len(runs)} run(s), {len(steps)} steps; block_size "
        f"{limits.block_size}, max_tokens {limits.max_tokens}, mixed warmup phase "
        f"{'yes' if limits.mixed else 'no'}. Each axis of the plan ends at the largest "
        f"value the config allows ({tops}), so no step the config can make misses.",
        *_stalled(runs),
        "",
        f"Use: `{usage}`",
        "",
        "| set | warmup shapes (prefill / decode / mixed) | token utilization | padded "
        "tokens | padded blocks | misses (served) | compiles while serving | misses on the "
        "recorded steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(_row(label, e, served) for label, e in results.items()),
        "",
        "Warmup shapes are the graphs warmup compiles (metrics.json's warmup_shapes): every "
        "bucket some step can pad to. Token utilization is real tokens over padded tokens "
        "(prefill rows x seq plus decode rows) on the recorded steps. The plan minimises "
        "padded tokens plus block_weight x block_size per padded block (block_weight "
        f"{block_weight}): a padded block is block_size KV slots read for nothing. Misses "
        "(served) and compiles while serving are measured: the plan served, warmed, on the "
        "simulated device (below). Misses on the recorded steps are parts beyond an axis's "
        "largest size on the source's steps.",
        "",
        *_served_table(served),
        "| axis | plan | linear | exponential |",
        "| --- | --- | --- | --- |",
    ]
    for axis in AXES:
        cells = [_sizes_cell(sets[label].sizes[axis].tolist()) for label in sets]
        lines.append(f"| {axis} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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


# -- show ------------------------------------------------------------------------------------
def show(run: Path) -> str:
    """Each bucket the run used, its steps and token utilization, and the totals."""
    if not (run / "steps.jsonl").is_file():
        raise SourceError(f"{run}: no steps.jsonl; give a run folder")
    steps = read_step_lines(run / "steps.jsonl")
    by_bucket: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for step in steps:
        entry = by_bucket[step["bucket"]]
        entry[0] += 1
        entry[1] += step["num_tokens"]
        entry[2] += step["padded_tokens"]
    width = max([len("bucket"), *map(len, by_bucket)])
    out = [f"{'bucket':<{width}}  {'steps':>6}  {'utilization':>11}"]
    for bucket, (count, real, padded) in sorted(by_bucket.items(), key=lambda kv: -kv[1][0]):
        out.append(f"{bucket:<{width}}  {count:>6}  {real / padded:>11.3f}")
    real = sum(s["num_tokens"] for s in steps)
    padded = sum(s["padded_tokens"] for s in steps)
    metrics = read_metrics(run) or {}
    misses = metrics.get("bucket_misses", "unknown")
    out.append(
        f"{len(steps)} steps, {len(by_bucket)} buckets used: {real} real tokens, {padded} "
        f"padded ({padded - real} padding), token utilization "
        f"{real / padded if padded else 0:.3f}, bucket misses {misses}"
    )
    return "\n".join(out)


def simulated_run(overrides: list[str], folder: Path) -> Path:
    """Serves a workload config on the simulated device, warmed (no compile stalls shape
    its steps), into `folder`: the steps the real scheduler and metadata builder make for
    it, without a forward pass."""
    from pipeline.compose import compose_config
    from pipeline.run import run

    folder.mkdir(parents=True, exist_ok=True)
    run(compose_config(simulated(overrides)), folder)
    return folder


def workload_variants(overrides: list[str]) -> list[tuple[str, list[str]]]:
    """The planned workload itself and the same config at the next seed."""
    seed = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("seed=")), 0)
    return [("same", overrides), (f"seed{seed + 1}", with_seed(overrides, seed + 1))]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.buckets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser(
        "plan",
        help="choose bucket sizes from a run's or sweep's steps, or a workload config's",
        description="Plans a bucket set within --max-shapes warmup shapes, serves it, "
        "and writes OUT/buckets/NAME.yaml and OUT/report.md.",
        epilog="example: python -m pipeline.buckets plan --workload model=spec/llama31_8b "
        "workload.num_requests=200 workload.rate=4 --max-shapes 64 --out plans",
    )
    plan.add_argument("source", type=Path, nargs="?", help="a run or sweep folder")
    plan.add_argument(
        "--workload",
        nargs="+",
        metavar="OVERRIDE",
        help="plan for a config (overrides of python -m pipeline) served on the simulated device",
    )
    plan.add_argument("--max-shapes", type=int, default=64, help="warmup shapes at most (64)")
    plan.add_argument("--out", type=Path, required=True, help="the folder to write")
    plan.add_argument("--name", default="planned", help="the bucket file: +buckets=NAME")
    plan.add_argument(
        "--block-weight",
        type=float,
        default=0.001,
        help="a padded block costs this x block_size tokens (default 0.001)",
    )
    plan.add_argument(
        "--headroom",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"one size per axis {HEADROOM:.0%} past the observed maximum (default on)",
    )
    shown = commands.add_parser(
        "show",
        help="a run's bucket use and padding",
        description="Each bucket a run used: its steps and token utilization, and the totals.",
        epilog="example: python -m pipeline.buckets show outputs/2026-01-01/12-00-00",
    )
    shown.add_argument("run", type=Path, help="a run folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "show":
            print(show(args.run))
            return 0
        if args.max_shapes < 1 or not 0 <= args.block_weight < math.inf:  # NaN fails too
            raise SourceError("--max-shapes needs 1 or more and --block-weight 0 or more")
        source, variants = args.source, None
        if args.workload:
            source = simulated_run(args.workload, args.out / "simulated-run")
            variants = workload_variants(args.workload)
        elif source is None:
            raise SourceError("give a run or sweep folder, or --workload OVERRIDES")
        plan_source(
            source, args.max_shapes, args.out, args.name, args.block_weight, args.headroom,
            variants,
        )  # fmt: skip
    except ValueError as err:  # a bad folder or config, or no set within the budget
        print(f"Error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # --out on a read-only path, or a file where a folder must be
        where = err.filename or args.out
        print(
            f"Error: cannot write {where}: {err.strerror or err}: choose another --out",
            file=sys.stderr,
        )
        return 2
    print((args.out / "report.md").read_text(), end="")
    return 0
