"""Published MoE figures measured with expert parallelism and data-parallel attention,
simulated in their method, against what was published.

    python -m benchmarks.published_moe [--hardware h100] [--layout TP,EP,DP] [--record]

The file is pipeline/calibrate/data/published-moe.csv: TensorRT-LLM's v1.0 performance
overview for Qwen3-235B-A22B in FP8 on 8 H200 or 8 H100 (trtllm-bench offline, `--tp 8
--ep $ep_size` with `enable_attention_dp`; each row names its source), the columns of
published-measurements.csv plus `ep` and `dp`. None of these rows was used to fit a
profile. One dp replica is simulated (docs/simulator.md, "Expert parallelism"): it gets
1 / dp of the requests, all queued at once with trtllm-bench's batch limits taken from its
own KV pool, as published.py does for a whole deployment; the deployment's throughput is
dp times the replica's. `--record` writes the median error as the result of the feature
the rows were read as (dp > 1: attention_dp; ep > 1 at dp = 1: expert_parallel) for the
plan's bands (pipeline/calibrate/check_results.py); over every row only.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from typing import Any

from benchmarks import moe_kernels
from pipeline.build import build
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
from pipeline.compose import compose_config
from pipeline.executors.simulated import build_simulated_engine
from pipeline.metrics import StepTotals
from stages.arithmetic import ceil_div
from stages.simulator.device import VirtualClock
from stages.simulator.expert_parallel import ExpertParallel
from stages.simulator.hardware import kv_pool_blocks
from stages.simulator.precision import Precision

DATA = DATA_DIR / "published-moe.csv"


def layouts(path: str) -> list[ExpertParallel]:
    """Each row's ep and dp, in the file's order."""
    with open(path, newline="", encoding="utf-8") as f:
        return [ExpertParallel(int(line["ep"]), int(line["dp"])) for line in csv.DictReader(f)]


def simulate_replica(row: PublishedRow, layout: ExpertParallel) -> RowRun:
    """One dp replica serves its 1 / dp of the row's requests; the deployment's output
    throughput is dp times the replica's."""
    start, cpu = time.perf_counter(), time.process_time()
    share = dataclasses.replace(row, num_requests=ceil_div(row.num_requests, layout.dp))
    cfg = compose_config([*row_overrides(share), f"ep={layout.ep}", f"dp={layout.dp}"])
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


# The rows' deployment is not certain (docs/simulator.md): each family reads them so.
READINGS = {
    "moe": (8, 1, 1),  # attention and experts tensor-parallel over the 8 GPUs, no EP
    "ep": (8, 8, 1),  # the command's --tp 8 --ep 8: experts EP 8 beside attention TP 8
    "ep_attention_dp": (1, 8, 8),  # the file's: attention DP 8, experts EP 8
}


def reading_runs(path: str, tp: int, ep: int, dp: int) -> list[RowRun]:
    rows = [dataclasses.replace(r, tp=tp) for r in read_rows(path)]
    return [simulate_replica(r, ExpertParallel(ep, dp)) for r in rows]


def results(path: str = str(DATA)) -> dict[str, dict[str, dict[str, Any]]]:
    """Each family's result, what plan bands read: per reading of the rows, `fit` the MoE
    kernel rows the grouped-GEMM figures were fitted to (benchmarks/moe_kernels.py),
    `held_out` these rows (none was used to fit anything)."""
    hw = build(compose_config(["executor=simulated", "hardware=h100"]).hardware)
    kernels = [
        r for r in moe_kernels.read_rows(moe_kernels.DATA) if r.batch <= moe_kernels.FIT_BATCH
    ]
    fitted = [r for r in kernels if r.model == moe_kernels.FIT_MODEL]
    kernel_errors = [
        abs(e) for e in moe_kernels.errors(fitted, hw, hw.moe_layer_s, hw.moe_expert_s)
    ]
    fit = {"rows": len(fitted), "median": median(kernel_errors), "worst": max(kernel_errors)}
    out = {}
    for family, layout in READINGS.items():
        errors = [abs(r.error) for r in reading_runs(path, *layout)]
        held = {"rows": len(errors), "median": median(errors), "worst": max(errors)}
        out[family] = {"fit": fit, "held_out": held}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA), help="a published MoE CSV (ep, dp columns)")
    parser.add_argument("--hardware", default="", help="only these devices, comma-separated")
    parser.add_argument(
        "--layout", default="", help="TP,EP,DP: every row read as this deployment instead"
    )
    parser.add_argument("--record", action="store_true", help="write the result for the bands")
    args = parser.parse_args(argv)
    if args.record and args.hardware:
        print("Error: --record needs every row: drop --hardware", file=sys.stderr)
        return 2
    try:
        rows = list(zip(read_rows(args.file), layouts(args.file), strict=True))
    except (ValueError, KeyError) as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    if args.layout:  # e.g. 8,8,1: attention tensor-parallel over the 8 GPUs, experts EP 8
        tp, ep, dp = map(int, args.layout.split(","))
        rows = [(dataclasses.replace(r, tp=tp), ExpertParallel(ep, dp)) for r, _ in rows]
    devices = set(filter(None, args.hardware.split(",")))
    runs = [simulate_replica(r, lay) for r, lay in rows if not devices or r.hardware in devices]
    print("\n".join(error_lines(runs)))
    errors = [abs(r.error) for r in runs]
    print(f"\nall {len(runs)} rows: median error {median(errors):.1%}, worst {max(errors):.1%}")
    feature = moe_feature([lay for _, lay in rows])
    if args.record and feature:
        devices = [r.row.hardware for r in runs]
        command = command_line("benchmarks.published_moe", sys.argv[1:] if argv is None else argv)
        path = record(feature, [r.error for r in runs], devices, args.file, command)
        print(f"recorded {path}")
    return 0


def moe_feature(read_as: list[ExpertParallel]) -> str:
    """The feature the rows, as read, check: attention_dp, expert_parallel, or none."""
    if any(lay.dp > 1 for lay in read_as):
        return "attention_dp"
    return "expert_parallel" if any(lay.ep > 1 for lay in read_as) else ""


if __name__ == "__main__":
    sys.exit(main())
