"""How fast a simulated run replays a large trace: a generated Azure-format trace served by
`executor=simulated` in-process through pipeline.job.run (so the run folder's files are all
written), with the wall time, the requests, output tokens and steps, and on request the
functions the time goes to (cProfile).

    python -m benchmarks.simulate_speed [--rows 100000] [--profile] [--top 25] [OVERRIDES...]

The defaults: ERNIE-4.5-21B-A3B on a Gaudi 3, `max_num_seqs=256` (a common serving batch
for a 3B-active MoE), `max_tokens=8192` (a whole 8k prompt fits one step's budget) and
`max_model_len=8704` (the trace's longest prompt and output: nothing is clipped), and
warmed-up exponential buckets (`metadata.bucketing=exponential warmup=true`), as a
deployment serves: without warmup every new shape pays a compile on the virtual clock.
Extra OVERRIDES are Hydra overrides appended to these.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

from benchmarks.trace_load import write_azure_trace
from pipeline.config.compose import compose_config
from pipeline.job.run import run

DEFAULTS = [
    "executor=simulated",
    "model=spec/ernie45_21b_a3b",
    "hardware=gaudi3",
    "workload=trace",
    "max_num_seqs=256",
    "max_tokens=8192",
    "max_model_len=8704",
    "metadata.bucketing=exponential",
    "warmup=true",
]


def serve_trace(trace: Path, out_dir: Path, overrides: list[str]) -> dict:
    """The simulated run of the trace into out_dir; returns its metrics."""
    cfg = compose_config([*DEFAULTS, f"workload.path={trace}", *overrides])
    return run(cfg, out_dir)


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="trace rows (requests)")
    parser.add_argument("--profile", action="store_true", help="cProfile the run")
    parser.add_argument("--top", type=int, default=25, help="functions the profile lists")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. max_num_seqs=128")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trace, out_dir = Path(folder) / "azure.csv", Path(folder) / "run"
        out_dir.mkdir()
        write_azure_trace(trace, args.rows)
        profiler = cProfile.Profile() if args.profile else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        metrics = serve_trace(trace, out_dir, args.overrides)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - start
        steps = count_lines(out_dir / "steps.jsonl")
    print(f"\nwall time       {wall:.1f} s (1-minute load average {os.getloadavg()[0]:.2f})")
    print(f"requests        {metrics['num_requests']:,} ({metrics['num_errors']} errors)")
    print(f"output tokens   {metrics['output_tokens']:,}")
    print(f"steps           {steps:,}")
    print(f"simulated time  {metrics['duration_s']:.1f} s")
    if profiler:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).sort_stats("tottime")
        stats.print_stats(args.top)
        print(text.getvalue())


if __name__ == "__main__":
    main()
