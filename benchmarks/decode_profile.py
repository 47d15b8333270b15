"""Where one decode step's time goes, on a real model: the step's parts, then the forward's
operators under Paddle's profiler.

    python -m benchmarks.decode_profile FILE.gguf --batch 1 [overrides ...]

`batch` requests with `--context` tokens cached each: the step's parts (metadata build,
model forward, sampling) timed alone, best and median of `--repeats`; the weights' bytes
and the time they take to read at the read bandwidth measured in the same process (the
forward's memory floor at one row); then one profiled forward: operator calls, their own
CPU time by kind and the costliest operators. What the forward holds beyond its
operators' own time is Python and op launches. Paddle's profiler starts once a process,
so each batch size is its own process (`profile_report`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pipeline  # noqa: F401  # isort: skip  (chooses MKL's code path before Paddle loads it)
import paddle.profiler as paddle_profiler  # isort: skip

from benchmarks.decode_step import decode_engine, decode_plan, read_bandwidth, timed_ms
from benchmarks.profile_steps import KINDS, _paddle_ops, kind_of


def profile_lines(gguf: Path, batch: int, context: int, threads: int, overrides: list[str]):
    engine = decode_engine("gguf", threads, batch, context, [f"model.path={gguf}", *overrides])
    plan = decode_plan(engine, batch, context)
    meta = engine.metadata.build(plan)

    def forward() -> float:
        return float(engine.model.forward(meta, engine.attention)[0, 0])

    logits = engine.model.forward(meta, engine.attention)
    parts = {
        "metadata": timed_ms(lambda: engine.metadata.build(plan), 20),
        "forward": timed_ms(forward, 20),
        "sample": timed_ms(lambda: engine.sampler.sample(logits, plan.decode), 20),
    }
    weight_bytes = engine.model.num_bytes
    read_ms = weight_bytes / read_bandwidth() * 1e3
    prof = paddle_profiler.Profiler(
        targets=[paddle_profiler.ProfilerTarget.CPU], on_trace_ready=lambda _: None
    )
    prof.start()
    start = time.perf_counter()
    forward()
    wall_ms = (time.perf_counter() - start) * 1e3
    prof.stop()
    seconds, calls = _paddle_ops(prof)
    by_kind = dict.fromkeys(KINDS, 0.0)
    for op, s in seconds.items():
        by_kind[kind_of(op)] += s * 1e3
    ops_ms = sum(by_kind.values())
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:6]
    step = " + ".join(
        f"{name} {best:.2f} (median {med:.2f})" for name, (best, med) in parts.items()
    )
    return [
        f"**batch {batch}, context {context}**: {step} ms. Weights {weight_bytes / 2**20:.0f} "
        f"MiB: {read_ms:.1f} ms to read once at this process's measured read bandwidth.",
        f"One profiled forward: {wall_ms:.1f} ms wall, {calls} Paddle operator calls, their "
        f"own time {ops_ms:.1f} ms ("
        + ", ".join(f"{k} {v:.1f}" for k, v in by_kind.items() if v)
        + f"); beyond Paddle's operators (Python, launches, and the compiled operators of "
        f"model.weights=int8, which its profiler does not list): {wall_ms - ops_ms:.1f} ms. "
        "Costliest: " + ", ".join(f"{op} {s * 1e3:.1f}" for op, s in top) + " ms.",
    ]


def profile_report(gguf: Path, threads: int, streams: int, overrides: list[str]) -> list[str]:
    """The profile at one row and at `streams` rows, each in its own process."""
    lines = [
        f"### Where a decode step's time goes ({threads} threads, ms)",
        "",
    ]
    for batch in (1, streams):
        command = [sys.executable, "-m", "benchmarks.decode_profile", str(gguf)]
        command += [f"--batch={batch}", f"--threads={threads}", *overrides]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"decode profile failed: {done.stderr.strip()[-2000:]}")
        lines += [*done.stdout.strip().splitlines(), ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="extra pipeline overrides")
    args = parser.parse_intermixed_args()
    lines = profile_lines(args.gguf, args.batch, args.context, args.threads, args.overrides)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
