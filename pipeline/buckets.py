"""`python -m pipeline.buckets`: plan a bucket set from served steps, or show a run's use.

    python -m pipeline.buckets plan RUN_OR_SWEEP --max-shapes 64 --out DIR [--name planned]
    python -m pipeline.buckets plan --workload OVERRIDES... --max-shapes 64 --out DIR
    python -m pipeline.buckets show RUN

With --workload, SOURCE is a workload config (any overrides of `python -m pipeline`): it is
served on the simulated device (shapes only, no weights; `hardware=gaudi3` unless given)
into DIR/simulated-run, and the plan is made from those steps.

`plan` writes DIR/buckets/NAME.yaml, a config file used as
`python -m pipeline hydra.searchpath=[file://DIR] +buckets=NAME`, and DIR/report.md: the
plan against the linear and exponential sets of the run's config on the same steps.
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

from pipeline.run_folder import read_mapping, read_metrics, read_step_lines
from stages.bucket_planner import Evaluation, Plan, Workload, evaluate, plan_buckets
from stages.buckets import Axis, Bucketing, Buckets
from stages.interfaces import Scheduler
from stages.kv_cache import blocks_for
from stages.metadata import AXES, resolve_axes


class SourceError(ValueError):
    """A folder that cannot be planned from; the message says why."""


@dataclass
class RunLimits:
    """What a run's config fixes about its buckets."""

    block_size: int
    max_tokens: int
    mixed: bool  # the scheduler splits prompts, so warmup has a mixed phase
    axes: dict[str, Axis]  # the config's min/step/max, any explicit sizes left out

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
    axes = resolve_axes(
        given,
        cfg.block_size,
        cfg.max_tokens,
        cfg.max_num_seqs,
        cfg.max_model_len,
        _num_blocks(run, cfg),
    )
    return RunLimits(
        block_size=cfg.block_size,
        max_tokens=cfg.max_tokens,
        mixed=bool(scheduler.splits_prompts),
        axes=axes,
    )


def load_source(source: Path) -> tuple[list[Path], RunLimits, list[dict[str, Any]]]:
    """(runs, their shared limits, all their steps); runs must agree on the limits."""
    runs = find_runs(source)
    limits = [run_limits(run) for run in runs]
    for key in ("block_size", "max_tokens", "mixed"):
        if len({getattr(lim, key) for lim in limits}) > 1:
            raise SourceError(
                f"{source}: the jobs differ in {key}; a bucket set serves one config, so "
                "plan from the jobs that share it"
            )
    return runs, limits[0], [step for run in runs for step in read_steps(run)]


# -- plan ------------------------------------------------------------------------------------
def plan_source(
    source: Path, max_shapes: int, out: Path, name: str, block_weight: float
) -> tuple[Plan, dict[str, Evaluation]]:
    runs, limits, steps = load_source(source)
    workload = Workload.of(steps)
    linear = limits.buckets(Bucketing.linear)
    fallback = {axis: [int(sizes[-1])] for axis, sizes in linear.sizes.items()}
    plan = plan_buckets(
        workload,
        max_shapes,
        limits.block_size,
        limits.max_tokens,
        limits.mixed,
        block_weight,
        unobserved=fallback,
    )
    sets = {
        "plan": limits.buckets(Bucketing.linear, plan.sizes),
        "linear": linear,
        "exponential": limits.buckets(Bucketing.exponential),
    }
    results = {
        label: evaluate(workload, buckets, limits.block_size, limits.max_tokens, limits.mixed)
        for label, buckets in sets.items()
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "buckets").mkdir(exist_ok=True)
    usage = f"python -m pipeline hydra.searchpath=[file://{out.resolve()}] +buckets={name}"
    header = (
        f"Planned by python -m pipeline.buckets plan {source} --max-shapes {max_shapes}: "
        f"{results['plan'].num_shapes} warmup shapes, token utilization "
        f"{results['plan'].utilization:.3f} on {len(steps)} steps."
    )
    (out / "buckets" / f"{name}.yaml").write_text(bucket_file(plan.sizes, header, usage))
    (out / "report.md").write_text(
        report(source, runs, steps, limits, block_weight, usage, sets, results)
    )
    return plan, results


def bucket_file(sizes: dict[str, list[int]], header: str, usage: str) -> str:
    axes = "".join(f"  {axis}: {{sizes: {list(values)}}}\n" for axis, values in sizes.items())
    return f"# @package _global_\n# {header}\n# Use: {usage}\nmetadata:\n{axes}"


def _row(label: str, e: Evaluation) -> str:
    phases = " / ".join(str(e.shapes.get(p, 0)) for p in ("prefill", "decode", "mixed"))
    return (
        f"| {label} | {e.num_shapes} ({phases}) | {e.utilization:.3f} | {e.padded_tokens} | "
        f"{e.padded_blocks} | {e.misses} | {e.unwarmed} |"
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
) -> str:
    lines = [
        "# Bucket plan",
        "",
        f"From `{source}`: {len(runs)} run(s), {len(steps)} steps; block_size "
        f"{limits.block_size}, max_tokens {limits.max_tokens}, mixed warmup phase "
        f"{'yes' if limits.mixed else 'no'}.",
        "",
        f"Use: `{usage}`",
        "",
        "| set | warmup shapes (prefill / decode / mixed) | token utilization | padded "
        "tokens | padded blocks | misses | outside warmup |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(_row(label, e) for label, e in results.items()),
        "",
        "Token utilization is real tokens over padded tokens (prefill rows x seq plus decode "
        "rows). The plan minimises padded tokens plus block_weight x block_size per padded "
        f"block (block_weight {block_weight}): a padded block is block_size KV slots read "
        "for nothing. Misses are parts beyond an axis's largest size (the run's "
        "bucket_misses); outside warmup, prefill parts padded to a shape warmup skips "
        "(rows x seq over max_tokens, or a table narrower than the chunk). Decode blocks "
        "are as recorded; whether a step spans the pool can depend on the set.",
        "",
        "| axis | plan | linear | exponential |",
        "| --- | --- | --- | --- |",
    ]
    for axis in AXES:
        cells = [_sizes_cell(sets[label].sizes[axis].tolist()) for label in sets]
        lines.append(f"| {axis} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
    """Serves a workload config on the simulated device into `folder`: the steps the real
    scheduler and metadata builder make for it, without a forward pass."""
    from pipeline.compose import compose_config
    from pipeline.run import run

    device = [] if any(o.startswith("hardware=") for o in overrides) else ["hardware=gaudi3"]
    cfg = compose_config(["executor=simulated", *device, *overrides])
    folder.mkdir(parents=True, exist_ok=True)
    run(cfg, folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.buckets", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="choose bucket sizes from a run's or sweep's steps")
    plan.add_argument("source", type=Path, nargs="?", help="a run or sweep folder")
    plan.add_argument("--workload", nargs="+", metavar="OVERRIDE", help="plan for a config")
    plan.add_argument("--max-shapes", type=int, default=64, help="warmup shapes at most")
    plan.add_argument("--out", type=Path, required=True)
    plan.add_argument("--name", default="planned", help="the bucket file: +buckets=NAME")
    plan.add_argument(
        "--block-weight",
        type=float,
        default=0.001,
        help="a padded block costs this x block_size tokens (default 0.001)",
    )
    shown = commands.add_parser("show", help="a run's bucket use and padding")
    shown.add_argument("run", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            print(show(args.run))
            return 0
        if args.max_shapes < 1 or not 0 <= args.block_weight < math.inf:  # NaN fails too
            raise SourceError("--max-shapes needs 1 or more and --block-weight 0 or more")
        source = args.source
        if args.workload:
            source = simulated_run(args.workload, args.out / "simulated-run")
        elif source is None:
            raise SourceError("give a run or sweep folder, or --workload OVERRIDES")
        plan_source(source, args.max_shapes, args.out, args.name, args.block_weight)
    except ValueError as err:  # a bad folder, or no set within the budget
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


if __name__ == "__main__":
    sys.exit(main())
