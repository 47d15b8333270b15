"""Published MoE figures measured with expert parallelism and data-parallel attention,
simulated in their method, against what was published.

    python -m benchmarks.published_moe [--file CSV] [--hardware h100] [--layout TP,EP,DP]
                                       [--fit] [--record]

Two files, each row naming its source and its stated settings, the columns of
published-measurements.csv plus `ep`, `dp` and `split`:
pipeline/calibrate/data/published-moe.csv, TensorRT-LLM's v1.0 performance overview for
Qwen3-235B-A22B in FP8 on 8 H200 or 8 H100 (trtllm-bench offline, `--tp 8 --ep $ep_size`
with `enable_attention_dp`, the deployment not certain: docs/simulator.md), and
pipeline/calibrate/data/published-attention-dp.csv, the later overview's rows whose column
states the layout (DEP4 on H200, DEP8 on H100: attention DP and EP over 4 or 8 GPUs). One
dp replica is simulated (docs/simulator.md, "Expert parallelism"): it gets 1 / dp of the
requests, all queued at once with trtllm-bench's batch limits taken from its own KV pool,
as published.py does for a whole deployment; the deployment's throughput is dp times the
replica's, its steps the lockstep's (stages/simulator/expert_parallel.py).

Without `--file` or `--layout` the attention-DP family is checked: both files' rows at
their layouts, each split's median and worst error. `--fit` fits the one figure fitted to
these rows, the replicas' step spread (`dp_step_spread`), on the rows marked `fit` (the v1.0
H200 rows) and prints it; those marked `held_out` check it. `--layout` reads the v1.0 rows
as another deployment (`8,8,1`: attention TP 8, experts EP 8; `8,1,1`: no EP): there dp = 1
and nothing was fitted to them. `--record` writes the result for the plan's bands
(pipeline/calibrate/check_results.py): the attention-DP family's held-out rows as
`attention_dp`, or a `--layout` reading's every row as `expert_parallel` (ep > 1, dp = 1).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import moe_kernels
from pipeline.calibrate.check_results import command_line, record
from pipeline.calibrate.published import (
    DATA_DIR,
    GPU_BLOCK,
    PublishedRow,
    RowRun,
    error_lines,
    fixed_requests,
    median,
    offline_limits,
    read_rows,
    row_overrides,
)
from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from pipeline.executors.simulated import build_simulated_engine
from pipeline.job.metrics import StepTotals
from stages.arithmetic import ceil_div
from stages.simulator.device import VirtualClock
from stages.simulator.expert_parallel import ExpertParallel
from stages.simulator.hardware import kv_pool_blocks
from stages.simulator.moe_layer import largest_of_normals
from stages.simulator.precision import Precision

DATA = DATA_DIR / "published-moe.csv"
STATED = DATA_DIR / "published-attention-dp.csv"  # rows whose source states attention DP
SPLITS = ("fit", "held_out")


@dataclasses.dataclass(frozen=True)
class MoeRow:
    """A published row, the deployment it is read as, and its split."""

    row: PublishedRow
    layout: ExpertParallel
    split: str
    source: str  # the file's name


def layouts(path: str) -> list[ExpertParallel]:
    """Each row's ep and dp, in the file's order."""
    return [r.layout for r in moe_rows(path)]


def moe_rows(path: str) -> list[MoeRow]:
    """The file's rows with their ep, dp and split, in the file's order."""
    with open(path, newline="", encoding="utf-8") as f:
        lines = list(csv.DictReader(f))
    rows = read_rows(path)
    found = []
    for row, line in zip(rows, lines, strict=True):
        if line.get("split") not in SPLITS:
            raise ValueError(f"{path}: split={line.get('split')!r}: one of {', '.join(SPLITS)}")
        layout = ExpertParallel(int(line["ep"]), int(line["dp"]))
        found.append(MoeRow(row, layout, line["split"], Path(path).name))
    return found


def attention_dp_rows() -> list[MoeRow]:
    """The attention-DP family: both files' rows at their own layouts."""
    return moe_rows(str(DATA)) + moe_rows(str(STATED))


def simulate_replica(row: PublishedRow, layout: ExpertParallel) -> RowRun:
    """One dp replica serves its 1 / dp of the row's requests; the deployment's output
    throughput is dp times the replica's."""
    start, cpu = time.perf_counter(), time.process_time()
    share = dataclasses.replace(row, num_requests=ceil_div(row.num_requests, layout.dp))
    cfg = compose_config([*row_overrides(share), f"ep={layout.ep}", f"dp={layout.dp}"])
    cfg.dp_step_spread = layout.step_spread
    spec, profile = build(cfg.model), build(cfg.hardware)
    precision = Precision(cfg.quantization, cfg.kv_cache_dtype)
    pool = kv_pool_blocks(spec, profile, GPU_BLOCK, row.tp, precision, layout) * GPU_BLOCK
    batch, tokens = offline_limits(share, pool)
    cfg.max_num_seqs, cfg.max_tokens = batch, max(tokens, batch)
    engine, _ = build_simulated_engine(cfg, VirtualClock())
    requests = fixed_requests(share)
    totals = StepTotals()
    duration = engine.run(requests, totals.add, on_run=totals.add_run)  # leaps: no records
    tokens_out = sum(len(r.output_ids) for r in requests)
    return RowRun(
        row=row,
        predicted=layout.dp * tokens_out / duration,
        duration_s=duration,
        output_tokens=tokens_out,
        num_steps=totals.num_steps,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu,
        cost=engine.model.cost,  # type: ignore[attr-defined]
    )


def fit_step_spread(rows: Sequence[MoeRow], high: float = 4.0) -> float:
    """The dp_step_spread that minimises the rows' squared log error. Their requests are
    all queued at the start, so the schedule does not depend on the steps' times: a run
    at spread s takes its time at no spread times the lockstep 1 + s x the expected
    largest of dp standard normals, and is simulated once, at no spread."""
    errors, largest = [], []
    for r in rows:
        run = simulate_replica(r.row, dataclasses.replace(r.layout, step_spread=0.0))
        errors.append(math.log(run.predicted / r.row.value))
        largest.append(largest_of_normals(r.layout.dp))

    def loss(spread: float) -> float:
        return sum((e - math.log1p(spread * b)) ** 2 for e, b in zip(errors, largest, strict=True))

    low = 0.0
    while high - low > 1e-5:  # ternary search: the loss is unimodal in the spread
        a, b = low + (high - low) / 3, high - (high - low) / 3
        low, high = (low, b) if loss(a) <= loss(b) else (a, high)
    return round((low + high) / 2, 4)


def spread(errors: Sequence[float]) -> dict[str, Any]:
    magnitudes = [abs(e) for e in errors]
    return {"rows": len(magnitudes), "median": median(magnitudes), "worst": max(magnitudes)}


def split_errors(rows: Sequence[MoeRow], runs: Sequence[RowRun]) -> dict[str, dict[str, Any]]:
    """Per split (fit, held_out): rows, median and worst absolute error."""
    return {
        split: spread([run.error for r, run in zip(rows, runs, strict=True) if r.split == split])
        for split in SPLITS
    }


# The v1.0 rows' deployment is not certain (docs/simulator.md): each family reads them so.
READINGS = {
    "moe": (8, 1, 1),  # attention and experts tensor-parallel over the 8 GPUs, no EP
    "ep": (8, 8, 1),  # the command's --tp 8 --ep 8: experts EP 8 beside attention TP 8
}


def reading_runs(path: str, tp: int, ep: int, dp: int) -> list[RowRun]:
    rows = [dataclasses.replace(r, tp=tp) for r in read_rows(path)]
    return [simulate_replica(r, ExpertParallel(ep, dp)) for r in rows]


def results(path: str = str(DATA)) -> dict[str, dict[str, dict[str, Any]]]:
    """Each family's result, what plan bands read: the v1.0 rows read with attention and
    experts TP 8 (`moe`) and with experts EP 8 (`ep`), `fit` the MoE kernel rows the
    grouped-GEMM figures were fitted to (benchmarks/moe_kernels.py), `held_out` these rows
    (none fitted anything); and the attention-DP family (`ep_attention_dp`, both files at
    their layouts) by its split."""
    hw = build(compose_config(["executor=simulated", "hardware=h100"]).hardware)
    kernels = [
        r for r in moe_kernels.read_rows(moe_kernels.DATA) if r.batch <= moe_kernels.FIT_BATCH
    ]
    fitted = [r for r in kernels if r.model == moe_kernels.FIT_MODEL]
    kernel_errors = moe_kernels.errors(fitted, hw, hw.moe_layer_s, hw.moe_expert_s)
    out = {}
    for family, layout in READINGS.items():
        held = spread([r.error for r in reading_runs(path, *layout)])
        out[family] = {"fit": spread(kernel_errors), "held_out": held}
    rows = attention_dp_rows()
    out["ep_attention_dp"] = split_errors(rows, [simulate_replica(r.row, r.layout) for r in rows])
    return out


def chosen_rows(args: argparse.Namespace) -> list[MoeRow]:
    """The rows the arguments name: a file's or the attention-DP family's, at their layouts
    or read as `--layout`, on the devices named."""
    rows = moe_rows(args.file) if args.file else attention_dp_rows()
    if args.layout:  # e.g. 8,8,1: attention tensor-parallel over the 8 GPUs, experts EP 8
        tp, ep, dp = map(int, args.layout.split(","))
        read_as = ExpertParallel(ep, dp)
        rows = [
            dataclasses.replace(r, row=dataclasses.replace(r.row, tp=tp), layout=read_as)
            for r in moe_rows(args.file or str(DATA))
        ]
    devices = set(filter(None, args.hardware.split(",")))
    return [r for r in rows if not devices or r.row.hardware in devices]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default="", help="one published MoE CSV (ep, dp, split)")
    parser.add_argument("--hardware", default="", help="only these devices, comma-separated")
    parser.add_argument(
        "--layout", default="", help="TP,EP,DP: the v1.0 rows read as this deployment instead"
    )
    parser.add_argument("--fit", action="store_true", help="fit dp_step_spread on the fit rows")
    parser.add_argument("--record", action="store_true", help="write the result for the bands")
    args = parser.parse_args(argv)
    if args.record and (args.hardware or args.file or args.fit):
        print("Error: --record needs every row: drop --hardware, --file and --fit", file=sys.stderr)
        return 2
    try:
        rows = chosen_rows(args)
    except (ValueError, KeyError) as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    if args.fit:
        fitted = fit_step_spread([r for r in rows if r.split == "fit"])
        print(f"dp_step_spread fitted on the fit rows: {fitted}")
        return 0
    runs = [simulate_replica(r.row, r.layout) for r in rows]
    print("\n".join(error_lines(runs)))
    summary = (
        split_errors(rows, runs) if not args.layout else {"all": spread([r.error for r in runs])}
    )
    for split, figures in summary.items():
        if figures["rows"]:
            print(f"{split} {figures['rows']} rows: median error {figures['median']:.1%}, "
                  f"worst {figures['worst']:.1%}")  # fmt: skip
    if args.record:
        record_feature(rows, runs, argv)
    return 0


def record_feature(rows: Sequence[MoeRow], runs: Sequence[RowRun], argv: list[str] | None) -> None:
    """Writes the feature the rows, as read, check: the attention-DP family's held-out rows,
    or a dp = 1 reading's every row."""
    feature = moe_feature([r.layout for r in rows])
    if not feature:
        return
    kept = [(r, run) for r, run in zip(rows, runs, strict=True)
            if feature != "attention_dp" or r.split == "held_out"]  # fmt: skip
    command = command_line("benchmarks.published_moe", sys.argv[1:] if argv is None else argv)
    source = ", ".join(dict.fromkeys(r.source for r, _ in kept))
    devices = [run.row.hardware for _, run in kept]
    path = record(feature, [run.error for _, run in kept], devices, source, command)
    print(f"recorded {path}")


def moe_feature(read_as: list[ExpertParallel]) -> str:
    """The feature the rows, as read, check: attention_dp, expert_parallel, or none."""
    if any(lay.dp > 1 for lay in read_as):
        return "attention_dp"
    return "expert_parallel" if any(lay.ep > 1 for lay in read_as) else ""


if __name__ == "__main__":
    sys.exit(main())
