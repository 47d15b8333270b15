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
from collections import defaultdict
from pathlib import Path

from pipeline.buckets.fastdeploy import (
    is_fastdeploy_run,
    plan_fastdeploy,
    recipe_sets,
    server_limits,
)
from pipeline.buckets.report_md import report, speed_report
from pipeline.buckets.serving import (
    Served,
    planned_set,
    run_overrides,
    serve_plan,
    serve_set,
    simulated,
    with_seed,
)
from pipeline.buckets.sources import SourceError, find_runs, load_source, run_limits
from pipeline.buckets.speed import Choice, candidate_plans, choose, write_choice
from pipeline.buckets.vllm_gaudi import export_lines, vllm_strategy
from pipeline.command import ArgparseCommand, Failure
from pipeline.run_folder.reader import RESOLVED_CONFIG, read_mapping, read_metrics, read_step_lines
from pipeline.run_folder.run_files import RunFolderError, output_folder, write_file
from stages.forward.bucket_planner import HEADROOM, Evaluation, Plan, Workload, evaluate
from stages.forward.buckets import Bucketing

# The commands, and the parts other modules and tests use.
__all__ = ["COMMAND", "SourceError", "main", "plan_source", "run_limits", "show"]


# -- plan ------------------------------------------------------------------------------------
BUILTINS = (Bucketing.linear, Bucketing.exponential)
EXPONENTIAL_BUDGET = 0  # --max-shapes exponential: the exponential set's graph count


def plan_source(
    source: Path,
    max_shapes: int,
    out: Path,
    name: str,
    block_weight: float,
    headroom: bool = True,
    variants: list[tuple[str, list[str]]] | None = None,
) -> tuple[Plan, dict[str, Evaluation]]:
    """Plans candidate sets from the source's steps, serves each and the built-in sets
    on the first of `variants` (label, overrides; by default each run's own overrides and
    the first run's at the next seed, where the folders keep them), writes the recommended
    set as the bucket file, serves it on every variant and writes the report."""
    runs, limits, steps = load_source(source)
    workload = Workload.of(steps)
    if max_shapes == EXPONENTIAL_BUDGET:  # as many graphs as the exponential set has
        exponential = limits.buckets(Bucketing.exponential)
        max_shapes = evaluate(workload, exponential, limits.rule).num_shapes
    plans = candidate_plans(workload, max_shapes, limits.rule, block_weight, limits.tops,
                            HEADROOM if headroom else 0.0)  # fmt: skip
    sets = {label: limits.buckets(Bucketing.linear, p.sizes) for label, p in plans.items()}
    if variants is None:
        variants = default_variants(runs)
    builtins = builtin_sets(variants[0][1]) if variants else list(BUILTINS)
    sets.update({str(b): limits.buckets(b) for b in builtins})
    results = {label: evaluate(workload, buckets, limits.rule) for label, buckets in sets.items()}
    output_folder(out / "buckets")
    candidates, choice = _serve_candidates(plans, variants, out, name, max_shapes)
    # not served: the least padding at the given block weight (the first candidate)
    label = choice.chosen.label if choice else next(iter(plans))
    chosen = Plan({a: v.tolist() for a, v in sets[label].sizes.items()}, 0.0)
    if label in plans:
        chosen = plans[label]
    usage = (
        f"python -m pipeline hydra.searchpath=[file://{out.resolve()}] +buckets={name} warmup=true"
    )
    header = (
        f"Planned by python -m pipeline.buckets plan {source} --max-shapes {max_shapes}: "
        f"the set `{label}`, {results[label].num_shapes} warmup shapes, "
        + (choice.reason if choice else "the least padding (not served: no overrides)")
    )
    write_file(out / "buckets" / f"{name}.yaml", bucket_file(chosen.sizes, header, usage))
    served = serve_plan(variants, out, name) if variants else []
    text = report(source, runs, steps, limits, block_weight, usage, sets, results, served, label)
    write_file(out / "report.md", text + speed_report(candidates, choice, label))
    write_choice(out / "choice.json", candidates, choice, label, max_shapes)
    return chosen, {**results, "plan": results[label]}  # "plan": the recommended set


def _serve_candidates(
    plans: dict[str, Plan],
    variants: list[tuple[str, list[str]]],
    out: Path,
    name: str,
    budget: int,
) -> tuple[list[Served], Choice | None]:
    """Each candidate and built-in set served on the first variant, and the choice."""
    if not variants:
        return [], None
    first = variants[0][1]
    served = []
    for label, plan in plans.items():
        file = f"{name}-{label}"
        sizes = bucket_file(plan.sizes, f"candidate {label}", "")
        write_file(out / "buckets" / f"{file}.yaml", sizes)
        served.append(serve_set(first, planned_set(out, file), out / f"set-{label}", label))
    builtins = [
        serve_set(first, [f"metadata.bucketing={b}"], out / f"set-{b}", str(b))
        for b in builtin_sets(first)
    ]
    return [*served, *builtins], choose(served, builtins, budget)


def builtin_sets(overrides: list[str]) -> list[Bucketing]:
    """Our linear and exponential sets, and vllm-gaudi's own default strategy where the
    workload is served with engine=vllm (its grid on Gaudi)."""
    engine = next((o.split("=", 1)[1] for o in overrides if o.startswith("engine=")), "")
    return [*BUILTINS, Bucketing.vllm_exp] if engine == "vllm" else list(BUILTINS)


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
    from pipeline.config.compose import compose_config
    from pipeline.job.run import run

    folder.mkdir(parents=True, exist_ok=True)
    run(compose_config(simulated(overrides)), folder)
    return folder


def workload_variants(overrides: list[str]) -> list[tuple[str, list[str]]]:
    """The planned workload itself and the same config at the next seed."""
    seed = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("seed=")), 0)
    return [("same", overrides), (f"seed{seed + 1}", with_seed(overrides, seed + 1))]


def _budget(text: str) -> int:
    if text == "exponential":
        return EXPONENTIAL_BUDGET
    value = int(text)  # argparse turns a ValueError into a one-line usage error
    return value if value > 0 else -1


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
    plan.add_argument(
        "--max-shapes",
        type=_budget,
        default=64,
        help="warmup graphs at most (64), or `exponential`: as many as the exponential set "
        "(on a FastDeploy run: recipe sets, and `exponential` as many as its default grid)",
    )
    plan.add_argument("--max-warmup", type=float, default=0.0, help="warmup seconds at most, "
                      "at the run's compile_s a graph (beside --max-shapes; 0 = none)")  # fmt: skip
    plan.add_argument("--out", type=Path, required=True, help="the folder to write")
    plan.add_argument("--name", default="planned", help="the bucket file: +buckets=NAME")
    plan.add_argument("--block-weight", type=float, default=0.001,
                      help="a padded block costs this x block_size tokens (0.001)")  # fmt: skip
    plan.add_argument(
        "--headroom",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"one size per axis {HEADROOM:.0%}% past the observed maximum (default on)",
    )
    shown = commands.add_parser(
        "show",
        help="a run's bucket use and padding",
        description="Each bucket a run used: its steps and token utilization, and the totals.",
        epilog="example: python -m pipeline.buckets show outputs/2026-01-01/12-00-00",
    )
    shown.add_argument("run", type=Path, help="a run folder")
    return parser


def cannot_write(err: Exception, args: argparse.Namespace) -> str:
    """--out on a read-only path, or a file where a folder must be."""
    os_err = err if isinstance(err, OSError) else OSError(str(err))
    where = os_err.filename or args.out
    return f"cannot write {where}: {os_err.strerror or err}: choose another --out"


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    if args.command == "show":
        print(show(args.run))
        return 0
    if args.max_shapes < 0 or not 0 <= args.block_weight < math.inf:  # NaN fails too
        raise SourceError(
            "--max-shapes needs 1 or more (or `exponential`) and --block-weight 0 or more"
        )
    source, variants = args.source, None
    if args.workload:
        source = simulated_run(args.workload, args.out / "simulated-run")
        variants = workload_variants(args.workload)
    elif source is None:
        raise SourceError("give a run or sweep folder, or --workload OVERRIDES")
    budget = warmup_budget(source, args.max_shapes, args.max_warmup)
    first = find_runs(source)[0]
    if is_fastdeploy_run(first):  # FastDeploy warms its environment's grid: plan that
        limits, defaults = server_limits(first)
        budget = budget or recipe_sets(defaults, limits)  # `exponential`: its defaults'
        plan = plan_fastdeploy(source, first, variants or default_variants([first]),
                               args.out, args.name, budget)  # fmt: skip
        write_file(args.out / "choice.json", json.dumps(plan, indent=2) + "\n")
    else:
        plan_source(source, budget, args.out, args.name, args.block_weight, args.headroom,
                    variants)  # fmt: skip
        if vllm_strategy(first) and (args.out / "served-same").is_dir():
            lines = export_lines(args.out / "served-same", args.out / "deploy")
            report = args.out / "report.md"
            write_file(report, report.read_text(encoding="utf-8") + "\n" + "\n".join(lines))
    print((args.out / "report.md").read_text(), end="")
    return 0


def warmup_budget(source: Path, max_shapes: int, max_warmup_s: float) -> int:
    """--max-shapes, held within --max-warmup at the run's compile_s a graph."""
    if max_warmup_s <= 0:
        return max_shapes
    hardware = (read_mapping(source / RESOLVED_CONFIG) or {}).get("hardware") or {}
    compile_s = float(hardware.get("compile_s") or 0.0)
    if compile_s <= 0:
        raise SourceError(f"{source}: no compile_s in its resolved config: give a simulated run")
    graphs = max(1, int(max_warmup_s // compile_s))
    return graphs if max_shapes == EXPONENTIAL_BUDGET else min(max_shapes, graphs)


COMMAND = ArgparseCommand(
    name="pipeline.buckets",
    parser=build_parser,
    run=run_command,
    failures=(
        Failure((ValueError,), 2),  # a bad folder or config, or no set within the budget
        Failure((OSError,), 2, cannot_write),
        Failure((RunFolderError,), 2),  # a link where a report goes
    ),
)


def main(argv: list[str] | None = None) -> int:
    return COMMAND.main(argv)
