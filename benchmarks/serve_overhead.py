"""Output throughput through HTTP against the batch run of the same workload.

    python -m benchmarks.serve_overhead --requests 128 --concurrency 32 --rounds 2 \\
        --out benchmarks/serve.md

One jsonl file of synthetic prompts (model=small's byte tokenizer, each asking for
--output-len tokens with ignore_eos) is served twice per round, in the order batch, server,
server, batch, ...: by `python -m pipeline workload=jsonl` with max_num_seqs=CONCURRENCY
(all requests arrive at once, so CONCURRENCY run together, as in a closed loop), and by
`python -m pipeline.serve` with the same overrides under `benchmarks.serve_load` with
CONCURRENCY streaming clients (in this process, on the same machine). The batch figure is
metrics.json's output_throughput (output tokens over the run's serving time); the server's
is the load generator's (output tokens over the time from the first request sent to the
last answer). Best of the rounds on each side, and every round, are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from hydra.utils import instantiate

from benchmarks.report import write_report
from benchmarks.serve_load import Load, Prompt, report, run_load
from pipeline.config.compose import compose_config
from stages.loading.tokenizer import ByteTokenizer

REPO = Path(__file__).resolve().parents[1]


def write_dataset(path: Path, args: argparse.Namespace) -> list[Prompt]:
    cfg = compose_config(
        [
            f"workload.num_requests={args.requests}",
            f"workload.min_prompt_tokens={args.min_prompt}",
            f"workload.max_prompt_tokens={args.max_prompt}",
            f"workload.min_new_tokens={args.output_len}",
            f"workload.max_new_tokens={args.output_len}",
        ]
    )
    requests = instantiate(cfg.workload).load(ByteTokenizer(add_bos=True))
    lines = [
        {"id": r.id, "prompt": r.prompt, "max_new_tokens": args.output_len, "ignore_eos": True}
        for r in requests
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return [Prompt(x["prompt"], args.output_len) for x in lines]


def engine_overrides(args: argparse.Namespace) -> list[str]:
    return [
        "model=small",
        f"max_num_seqs={args.concurrency}",
        f"max_model_len={args.max_prompt + args.output_len + 8}",
        f"num_threads={args.threads}",
    ]


def python(module: str, *overrides: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", module, *overrides]
    return subprocess.Popen(command, cwd=REPO, env=env, **kwargs)


def batch_run(dataset: Path, folder: Path, args: argparse.Namespace) -> float:
    overrides = [*engine_overrides(args), "workload=jsonl", f"workload.path={dataset}"]
    run = python("pipeline", *overrides, f"hydra.run.dir={folder}", stdout=subprocess.DEVNULL)
    if run.wait() != 0:
        raise SystemExit(f"the batch run failed: see {folder}")
    return json.loads((folder / "metrics.json").read_text())["output_throughput"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def started_server(overrides: list[str], folder: Path) -> Iterator[str]:
    """`python -m pipeline.serve overrides` on a free loopback port, until the block ends
    (then SIGTERM); yields its URL once /health says it is ready."""
    port = free_port()
    command = [*overrides, f"serve.port={port}", f"hydra.run.dir={folder}"]
    server = python("pipeline.serve", *command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: see {folder}")
            time.sleep(0.5)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)


def served_run(prompts: list[Prompt], folder: Path, args: argparse.Namespace) -> dict:
    with started_server(engine_overrides(args), folder) as url:
        return asyncio.run(run_load(Load(url=url, prompts=prompts, concurrency=args.concurrency)))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_overhead", description=__doc__)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--min-prompt", type=int, default=64)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="Paddle's CPU threads, both sides")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the markdown report here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve_overhead_"))
    dataset = work / "prompts.jsonl"
    prompts = write_dataset(dataset, args)
    batch, served = [], []
    for i in range(args.rounds):
        for side in ("batch", "server") if i % 2 == 0 else ("server", "batch"):
            folder = work / f"{side}{i}"
            if side == "batch":
                batch.append(batch_run(dataset, folder, args))
            else:
                served.append(served_run(prompts, folder, args))
                print(report(served[-1]), flush=True)
            print(f"round {i} {side}: done", flush=True)
    best_batch = max(batch)
    best_served = max(r["output_throughput"] for r in served)
    lines = [
        "# Serving overhead: output throughput through HTTP against the batch run",
        "",
        f"`python -m benchmarks.serve_overhead --requests {args.requests} --concurrency "
        f"{args.concurrency} --min-prompt {args.min_prompt} --max-prompt {args.max_prompt} "
        f"--output-len {args.output_len} --threads {args.threads} --rounds {args.rounds}`",
        "",
        "| round | batch run (tok/s) | through HTTP (tok/s) | failed |",
        "| --- | --- | --- | --- |",
        *(
            f"| {i} | {b:.1f} | {s['output_throughput']:.1f} | {s['failed']} |"
            for i, (b, s) in enumerate(zip(batch, served, strict=True))
        ),
        "",
        f"Best of each: batch {best_batch:.1f} tok/s, HTTP {best_served:.1f} tok/s: "
        f"**{100 * best_served / best_batch:.1f}%** of the batch run's output throughput.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_report(args.out, text)


if __name__ == "__main__":
    main()
