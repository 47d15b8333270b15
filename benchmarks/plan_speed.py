"""How fast the planner's parts run here: one simulated run of a conversation-shaped Azure
trace with and without the per-step and per-token files, and a whole plan on joblib.

    python -m benchmarks.plan_speed trace [--requests 19365] [--repeat 2] [--metrics-only]
        [--profile ROWS] [OVERRIDES...]
    python -m benchmarks.plan_speed plan [--requests 2000] [OVERRIDES...]

`trace`: Llama-3.1-8B on an H100 (the case the planner's speed target names), once through
pipeline.job.run (steps.jsonl, generations.jsonl) and once as a capacity-search probe writes it
(metrics.json only; where the simulated device leaps over runs of decode steps): wall and
CPU seconds (best of --repeat), the folder's size and the load average; with --profile,
instead one metrics-only probe under cProfile, its ROWS costliest functions by their own time
and with what they call (Engine.schedule_step's calls count the steps that admit arrivals,
run alone or starting a leap, and SimulatedDevice.run_decodes' the leaps; cProfile slows the
run several times over, so compare shares). `plan`: the 64 configurations of PLAN_SPACE,
each a capacity search, on `hydra/launcher=joblib`: the wall and CPU time of the command (its
workers included), the load average around it, the probes made and the plan folder's size.
The machine may be shared: repeat, take the best, and say so.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.azure_conversation import write_conversation_trace

TRACE_RUN = [
    "executor=simulated",
    "model=spec/llama31_8b",
    "hardware=h100",
    "workload=trace",
    "max_num_seqs=256",
    "max_tokens=8192",
    "max_model_len=10240",
    "metadata.bucketing=exponential",
    "warmup=true",
]
# 64 configurations: 4 x 2 x 2 x 2 x 2
PLAN_SPACE = [
    "max_tokens=1024,2048,4096,8192",
    "max_num_seqs=64,128",
    "scheduler=chunked,whole",
    "prefix_caching=true,false",
    "metadata.bucketing=linear,exponential",
]
PLAN_FIXED = [
    "model=spec/ernie45_21b_a3b",
    "hardware=gaudi2",
    "workload=trace",
    "max_model_len=10240",
    "slo.ttft_ms=2000",
    "slo.tpot_ms=50",
    "plan.max_warmup_s=3600",
    "plan.model_id=baidu/ERNIE-4.5-21B-A3B-Paddle",
    "hydra/launcher=joblib",
]


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def time_trace(
    trace: Path, root: Path, overrides: list[str], repeat: int, with_files: bool
) -> None:
    from pipeline.config.compose import compose_config
    from pipeline.job.run import run
    from pipeline.plan.capacity import run_probe

    cfg = compose_config([*TRACE_RUN, f"workload.path={trace}", *overrides])
    ways = (("with files", run), ("metrics only", None))
    for name, serve in ways if with_files else ways[1:]:
        best, best_cpu = float("inf"), float("inf")
        for i in range(repeat):
            out = root / f"{name.replace(' ', '_')}{i}"
            out.mkdir()
            t, cpu = time.perf_counter(), time.process_time()
            metrics = run(cfg, out) if serve else run_probe(cfg, out, keep_files=False)
            best = min(best, time.perf_counter() - t)
            best_cpu = min(best_cpu, time.process_time() - cpu)
        counts = f"{metrics['num_requests']:,} requests, {metrics['num_steps']:,} steps"
        print(f"{name}: {best:.1f} s wall, {best_cpu:.1f} s CPU (best of {repeat}), {counts}, "
              f"folder {folder_mb(out):.1f} MB, load {os.getloadavg()[0]:.1f}")  # fmt: skip


def profile_trace(trace: Path, root: Path, overrides: list[str], rows: int) -> None:
    from pipeline.config.compose import compose_config
    from pipeline.plan.capacity import run_probe

    cfg = compose_config([*TRACE_RUN, f"workload.path={trace}", *overrides])
    profiler = cProfile.Profile()
    profiler.runcall(run_probe, cfg, root / "profiled", keep_files=False)
    stats = pstats.Stats(profiler)
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(rows)


def time_plan(trace: Path, root: Path, overrides: list[str], keep: Path | None) -> None:
    sweep = keep or root / "plan"
    command = [sys.executable, "-m", "pipeline.plan", *PLAN_FIXED, *PLAN_SPACE,
               f"workload.path={trace}", f"hydra.sweep.dir={sweep}", *overrides]  # fmt: skip
    load_before = os.getloadavg()[0]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its workers
    cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(done.stdout[-12000:])
    if done.returncode:
        print(done.stderr[-2000:])
    searched = [json.loads(p.read_text()) for p in sweep.glob("*/capacity.json")]
    probes = sum(len(c["probes"]) for c in searched)
    print(f"plan: {len(searched)} configurations ({probes} probes) in {wall:.0f} s wall, "
          f"{cpu_s:.0f} s CPU, load average {load_before:.1f} before and "
          f"{os.getloadavg()[0]:.1f} after; folder {folder_mb(sweep):.1f} MB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["trace", "plan"])
    parser.add_argument("--requests", type=int, default=0, help="0: 19,365 (trace), 2,000 (plan)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="plan: write the plan folder here")
    parser.add_argument(
        "--metrics-only", action="store_true", help="trace: skip the run with files"
    )
    parser.add_argument("--profile", type=int, metavar="ROWS", help="trace: profile one probe")
    args, overrides = parser.parse_known_args()
    requests = args.requests or (19_365 if args.what == "trace" else 2000)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        trace = root / "conversation.csv"
        write_conversation_trace(trace, requests, 3600.0 * requests / 19_365)
        if args.what == "trace" and args.profile:
            profile_trace(trace, root, overrides, args.profile)
        elif args.what == "trace":
            time_trace(trace, root, overrides, args.repeat, not args.metrics_only)
        else:
            time_plan(trace, root, overrides, args.keep)


if __name__ == "__main__":
    main()
