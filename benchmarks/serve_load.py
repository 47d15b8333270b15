"""A load generator for any OpenAI-compatible server, with `vllm bench serve`'s metrics.

    python -m benchmarks.serve_load --url http://127.0.0.1:8000 --concurrency 32 \\
        --num-prompts 128 --input-len 256 --output-len 128            (closed loop)
    python -m benchmarks.serve_load --request-rate 4 --num-prompts 200    (open loop, Poisson)
    python -m benchmarks.serve_load --dataset prompts.jsonl ...           (prompt, max_new_tokens)
    python -m benchmarks.serve_load --concurrency 64 --duration-s 600 \\
        --disconnect-fraction 0.1                                        (a soak)

Every request streams from /v1/completions with `ignore_eos`, so each asks for exactly its
output length. Closed loop: --concurrency clients, each sending its next request when the
last one ends. Open loop: arrivals at --request-rate per second (a Poisson process), at most
--concurrency in flight when given. --disconnect-fraction of the requests hang up after a
random number of chunks (they count as disconnected, not failed). --duration-s keeps the
closed loop going for that long, with prompts drawn again in turn.

Metrics follow vLLM's definitions and names: TTFT (send to first text), TPOT ((E2E - TTFT)
/ (output tokens - 1)), ITL (every gap between chunks), E2EL (send to end), request and
output throughput over the benchmark's duration, completed requests only. When the server
exposes process_resident_memory_bytes on /metrics (pipeline.serve does), its resident
memory is sampled at the start, every --memory-every-s, and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

WORDS = "the of and to in is was for on that with as by at from it an be this are".split()


@dataclass
class Prompt:
    text: str
    output_len: int


@dataclass
class Outcome:
    """One request as the client saw it."""

    ok: bool = False
    disconnected: bool = False
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class Load:
    url: str
    prompts: list[Prompt]
    concurrency: int = 0
    request_rate: float = float("inf")
    duration_s: float = 0.0
    disconnect_fraction: float = 0.0
    api_key: str = ""
    model: str | None = None
    seed: int = 0
    memory_every_s: float = 30.0


def synthetic_prompts(count: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    """Prompts of random words about input_len characters long (a byte tokenizer's tokens)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        words, size = [], 0
        while size < input_len:
            words.append(rng.choice(WORDS))
            size += len(words[-1]) + 1
        prompts.append(Prompt(" ".join(words)[:input_len], output_len))
    return prompts


def read_dataset(path: Path, output_len: int) -> list[Prompt]:
    """A jsonl file's prompts, each with its max_new_tokens (else output_len)."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [Prompt(x["prompt"], int(x.get("max_new_tokens", output_len))) for x in lines]


async def one_request(
    client: httpx.AsyncClient, load: Load, prompt: Prompt, leave_after: int | None
) -> Outcome:
    """Streams one completion; hangs up after `leave_after` chunks when given."""
    body = {
        "prompt": prompt.text,
        "max_tokens": prompt.output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if load.model:
        body["model"] = load.model
    out = Outcome()
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", f"{load.url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return out
            chunks = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    out.error = str(event["error"])
                    return out
                if event.get("usage"):
                    out.output_tokens = event["usage"]["completion_tokens"]
                    out.prompt_tokens = event["usage"]["prompt_tokens"]
                if not any(c.get("text") for c in event.get("choices", [])):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    out.ttft_s = now - start
                else:
                    out.itl_s.append(now - last)
                last, chunks = now, chunks + 1
                if leave_after is not None and chunks >= leave_after:
                    out.disconnected = True
                    return out
    except httpx.HTTPError as err:
        out.error = f"{type(err).__name__}: {err}"
        return out
    out.e2e_s = time.perf_counter() - start
    out.ok = True
    return out


def exit_point(load: Load, prompt: Prompt, rng: random.Random) -> int | None:
    if rng.random() >= load.disconnect_fraction:
        return None
    return rng.randint(1, max(1, prompt.output_len // 2))


async def closed_loop(client: httpx.AsyncClient, load: Load, outcomes: list[Outcome]) -> None:
    """load.concurrency clients, each sending its next request as the last one ends."""
    rng = random.Random(load.seed)
    order = itertools.cycle(load.prompts) if load.duration_s else iter(load.prompts)
    end = time.perf_counter() + load.duration_s if load.duration_s else float("inf")

    async def client_loop() -> None:
        while time.perf_counter() < end:
            prompt = next(order, None)
            if prompt is None:
                return
            outcomes.append(await one_request(client, load, prompt, exit_point(load, prompt, rng)))

    await asyncio.gather(*(client_loop() for _ in range(load.concurrency)))


async def open_loop(client: httpx.AsyncClient, load: Load, outcomes: list[Outcome]) -> None:
    """Poisson arrivals at load.request_rate; at most load.concurrency in flight if set."""
    rng = random.Random(load.seed)
    limit = asyncio.Semaphore(load.concurrency or len(load.prompts))

    async def send(prompt: Prompt) -> None:
        async with limit:
            outcomes.append(await one_request(client, load, prompt, exit_point(load, prompt, rng)))

    tasks = []
    for prompt in load.prompts:
        tasks.append(asyncio.create_task(send(prompt)))
        if load.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(load.request_rate))
    await asyncio.gather(*tasks)


async def server_memory(client: httpx.AsyncClient, url: str) -> float | None:
    """The server's resident memory in MiB from its /metrics, if it reports it."""
    try:
        text = (await client.get(f"{url}/metrics")).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1]) / 2**20
    return None


async def run_load(load: Load) -> dict[str, Any]:
    """Runs the load; returns vllm bench serve's metrics (and memory samples)."""
    headers = {"Authorization": f"Bearer {load.api_key}"} if load.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(None, connect=30.0)
    outcomes: list[Outcome] = []
    memory: list[tuple[float, float]] = []
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
        start = time.perf_counter()

        async def sample_memory() -> None:
            while True:
                rss = await server_memory(client, load.url)
                if rss is not None:
                    memory.append((round(time.perf_counter() - start, 1), round(rss, 1)))
                await asyncio.sleep(load.memory_every_s)

        sampler = asyncio.create_task(sample_memory())
        closed = load.concurrency and load.request_rate == float("inf")
        await (closed_loop if closed else open_loop)(client, load, outcomes)
        duration = time.perf_counter() - start
        sampler.cancel()
        rss = await server_memory(client, load.url)
        if rss is not None:
            memory.append((round(duration, 1), round(rss, 1)))
    return {**summarise(outcomes, duration), "memory_mib": memory}


def _stats(name: str, values_s: list[float]) -> dict[str, float]:
    ms = np.asarray(values_s or [0.0]) * 1e3
    return {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
        f"p99_{name}_ms": float(np.percentile(ms, 99)),
    }


def summarise(outcomes: list[Outcome], duration: float) -> dict[str, Any]:
    done = [o for o in outcomes if o.ok]
    output = sum(o.output_tokens for o in done)
    prompt = sum(o.prompt_tokens for o in done)
    tpots = [(o.e2e_s - o.ttft_s) / (o.output_tokens - 1) for o in done if o.output_tokens > 1]
    errors = [o.error for o in outcomes if o.error]
    return {
        "duration": duration,
        "completed": len(done),
        "failed": len(errors),
        "disconnected": sum(o.disconnected for o in outcomes),
        "errors": errors[:5],
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": len(done) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration,
        **_stats("ttft", [o.ttft_s for o in done]),
        **_stats("tpot", tpots),
        **_stats("itl", [gap for o in done for gap in o.itl_s]),
        **_stats("e2el", [o.e2e_s for o in done]),
    }


def report(result: dict[str, Any]) -> str:
    """The result as vllm bench serve prints it."""
    rows = [
        ("Successful requests", result["completed"]),
        ("Failed requests", result["failed"]),
        ("Disconnected requests", result["disconnected"]),
        ("Benchmark duration (s)", f"{result['duration']:.2f}"),
        ("Total input tokens", result["total_input_tokens"]),
        ("Total generated tokens", result["total_output_tokens"]),
        ("Request throughput (req/s)", f"{result['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{result['output_throughput']:.2f}"),
        ("Total Token throughput (tok/s)", f"{result['total_token_throughput']:.2f}"),
    ]
    for name, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize()} {title} (ms)", f"{result[f'{stat}_{name}_ms']:.2f}"))
    if result.get("memory_mib"):
        first, last = result["memory_mib"][0][1], result["memory_mib"][-1][1]
        rows.append(("Server memory start / end (MiB)", f"{first} / {last}"))
    return "\n".join(f"{name:<40}{value:>12}" for name, value in rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.serve_load",
        description="Load an OpenAI-compatible server; print vllm bench serve's metrics.",
        epilog="example: python -m benchmarks.serve_load --url http://127.0.0.1:8000 "
        "--concurrency 32 --num-prompts 128",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=0, help="clients (closed loop) or a cap")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="open loop, req/s")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=256, help="characters of synthetic prompt")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dataset", type=Path, help="jsonl with prompt (and max_new_tokens)")
    p.add_argument("--duration-s", type=float, default=0.0, help="closed loop for this long")
    p.add_argument("--disconnect-fraction", type=float, default=0.0)
    p.add_argument("--api-key", default="")
    p.add_argument("--model", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-every-s", type=float, default=30.0)
    p.add_argument("--result", type=Path, help="write the metrics here as JSON")
    args = p.parse_args(argv)
    if args.request_rate == float("inf") and args.concurrency < 1:
        p.error("give --concurrency N (closed loop) or --request-rate R (open loop)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.dataset:
        prompts = read_dataset(args.dataset, args.output_len)[: args.num_prompts]
    else:
        prompts = synthetic_prompts(args.num_prompts, args.input_len, args.output_len, args.seed)
    load = Load(
        url=args.url.rstrip("/"),
        prompts=prompts,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        duration_s=args.duration_s,
        disconnect_fraction=args.disconnect_fraction,
        api_key=args.api_key,
        model=args.model,
        seed=args.seed,
        memory_every_s=args.memory_every_s,
    )
    result = asyncio.run(run_load(load))
    print(report(result))
    if args.result:
        args.result.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
