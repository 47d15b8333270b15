"""A soak: many streaming clients for minutes, some hanging up early; then every KV block
must be back in the pool and the server's memory flat.

    python -m benchmarks.serve_soak --minutes 10 --clients 64 --disconnect-fraction 0.1

Starts `python -m pipeline.serve` (loopback, a free port; --overrides for its config),
runs `benchmarks.serve_load` closed loop for --minutes with its memory sampled from
/metrics, then reads /metrics again once the load is over: free and total KV blocks,
running and waiting requests. Writes the load generator's report, the memory samples and
that last reading (--out: markdown).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import httpx

from benchmarks.report import write_report
from benchmarks.serve_load import Load, report, run_load, synthetic_prompts
from benchmarks.serve_overhead import started_server

AFTER = ("hpu_pipeline:kv_blocks_free", "hpu_pipeline:kv_blocks_total",
         "vllm:num_requests_running", "vllm:num_requests_waiting")  # fmt: skip


def metric_values(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--disconnect-fraction", type=float, default=0.1)
    p.add_argument("--input-len", type=int, default=200)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--memory-every-s", type=float, default=30.0)
    p.add_argument("--overrides", nargs="*", default=["model=tiny", "max_num_seqs=64"])
    p.add_argument("--folder", type=Path, default=Path("outputs/serve_soak"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    prompts = synthetic_prompts(1000, args.input_len, args.output_len, seed=0)
    with started_server(args.overrides, args.folder) as url:
        load = Load(url, prompts, concurrency=args.clients, duration_s=60 * args.minutes,
                    disconnect_fraction=args.disconnect_fraction,
                    memory_every_s=args.memory_every_s)  # fmt: skip
        result = asyncio.run(run_load(load))
        time.sleep(1.0)  # the aborts of the last hang-ups are taken before the next step
        after = {k: v for k, v in metric_values(url).items() if k in AFTER}
    lines = [
        f"# Soak: {args.clients} streaming clients, {args.minutes:g} min, "
        f"{args.disconnect_fraction:.0%} hang up early",
        "",
        f"`python -m benchmarks.serve_soak --minutes {args.minutes:g} --clients {args.clients} "
        f"--disconnect-fraction {args.disconnect_fraction} --overrides "
        f"{' '.join(args.overrides)}`",
        "",
        "```",
        report(result),
        "```",
        "",
        f"Server memory (s, MiB): {result['memory_mib']}",
        "",
        f"After the load: {after}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_report(args.out, text)


if __name__ == "__main__":
    main()
