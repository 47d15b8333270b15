"""Named benchmark scenarios through the real pipeline, written as one markdown report.

    python -m benchmarks.run --scenario all --out benchmarks/results.md   (from the repo root)
    python -m benchmarks.run --scenario throughput --requests 16
    python -m benchmarks.run --scenario long_prompts
    python -m benchmarks.run --scenario throughput --profile /tmp/profile.txt   (.[bench])

Scenarios (model=small unless said):
- throughput: N requests at once, prompts of mixed lengths, a fixed number of new tokens;
  also where a full decode step's time goes, outside the model forward and inside.
- latency: the same workload arriving as a Poisson process at --rate requests/s.
- sweep: the per-step token budget (max_tokens) over the throughput workload.
- long_prompts: +experiment=long_prompts (model=tiny): long prompts arriving while many
  requests decode, scheduler=chunked at a small budget against scheduler=whole, --rounds
  times each in the order chunked, whole, whole, chunked, ...
- prefix_cache: 64 requests at once sharing a 1,024-token system prompt, each with 64-256
  tokens of its own, prefix caching on against off (--rounds times each, alternating); and
  the cost of the prefix lookup on admission for a 2,048-token prompt.

Every row shows the machine's floor: the run's model FLOPs over the paddle.matmul rate
measured in the same process just before and after the run (the higher). All runs of one
invocation share the process, so their ratios are the figures to trust on a busy machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import ServedRun, serve, synthetic_overrides
from benchmarks.report import machine_line, overhead_table, run_table, write_report
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request

SCENARIOS = ("throughput", "latency", "sweep", "long_prompts", "prefix_cache")


def base_overrides(args: argparse.Namespace, requests: int) -> list[str]:
    return synthetic_overrides(
        requests, args.min_prompt, args.max_prompt, args.new_tokens, args.threads
    )


def run_scenario(name: str, args: argparse.Namespace) -> tuple[list[tuple[str, ServedRun]], list]:
    """The scenario's runs (label, run) and its notes (markdown lines)."""
    if name == "throughput":
        run = serve([*base_overrides(args, args.requests), f"max_tokens={args.max_tokens}"])
        label = f"throughput: {args.requests} at once, max_tokens={args.max_tokens}"
        return [(label, run)], [
            "### Decode step at full batch (throughput run)",
            "",
            *overhead_table(run),
        ]
    if name == "latency":
        overrides = [
            *base_overrides(args, args.latency_requests),
            f"max_tokens={args.max_tokens}",
            f"workload.rate={args.rate}",
        ]
        label = (
            f"latency: {args.latency_requests} at {args.rate} req/s, max_tokens={args.max_tokens}"
        )
        return [(label, serve(overrides))], []
    if name == "sweep":
        runs = []
        for budget in args.sweep:
            overrides = [*base_overrides(args, args.sweep_requests), f"max_tokens={budget}"]
            runs.append(
                (f"sweep: {args.sweep_requests} at once, max_tokens={budget}", serve(overrides))
            )
        return runs, []
    if name == "long_prompts":
        common = ["+experiment=long_prompts", f"num_threads={args.threads}"]
        settings = {
            f"scheduler=chunked max_tokens={args.chunk_budget}": "chunked",
            "scheduler=whole max_tokens=2048": "whole",
        }
        runs: dict[str, list[ServedRun]] = {"chunked": [], "whole": []}
        labelled = []
        # Chunked, whole, whole, chunked, ...: a drift in the machine's load evens out.
        for index in range(args.rounds):
            order = list(settings.items())
            for setting, kind in order if index % 2 == 0 else order[::-1]:
                run = serve([*common, *setting.split()])
                runs[kind].append(run)
                labelled.append((f"long_prompts: {setting} ({index + 1})", run))

        def mean(kind: str, read) -> float:
            return sum(read(run.metrics) for run in runs[kind]) / len(runs[kind])

        itl = {kind: mean(kind, lambda m: m["itl_ms"]["p99"]) for kind in runs}
        tput = {kind: mean(kind, lambda m: m["output_throughput"]) for kind in runs}
        ttft = {kind: mean(kind, lambda m: m["ttft_ms"]["p50"]) for kind in runs}
        notes = [
            "### Long prompts while many requests decode",
            "",
            f"Means over {args.rounds} rounds. p99 ITL: chunked (max_tokens={args.chunk_budget}) "
            f"{itl['chunked']:.0f} ms, whole {itl['whole']:.0f} ms, a ratio of "
            f"**{itl['chunked'] / itl['whole']:.2f}**; output throughput "
            f"{tput['chunked']:.1f} vs {tput['whole']:.1f} tok/s, a ratio of "
            f"**{tput['chunked'] / tput['whole']:.2f}**; TTFT p50 "
            f"{ttft['chunked']:.0f} vs {ttft['whole']:.0f} ms.",
        ]
        return labelled, notes
    if name == "prefix_cache":
        return prefix_cache_scenario(args)
    raise ValueError(f"unknown scenario {name}")


def prefix_cache_scenario(args: argparse.Namespace) -> tuple[list[tuple[str, ServedRun]], list]:
    common = [
        *synthetic_overrides(64, 64, 256, 32, args.threads),
        "max_model_len=1400",
        "max_tokens=2048",
        "workload.shared_prefix_tokens=1024",
    ]
    runs: dict[str, list[ServedRun]] = {"on": [], "off": []}
    labelled = []
    for index in range(args.rounds):
        order = ["on", "off"] if index % 2 == 0 else ["off", "on"]
        for kind in order:
            run = serve([*common, f"prefix_caching={'true' if kind == 'on' else 'false'}"])
            runs[kind].append(run)
            labelled.append((f"prefix_cache: caching {kind} ({index + 1})", run))

    def median(kind: str, read) -> float:
        return float(np.median([read(run.metrics) for run in runs[kind]]))

    ttft = {kind: median(kind, lambda m: m["ttft_ms"]["p50"]) for kind in runs}
    tput = {kind: median(kind, lambda m: m["output_throughput"]) for kind in runs}
    hits = median("on", lambda m: m["prefix_cache_hit_rate"])
    hashing_us, lookup_us = prefix_lookup_us(prompt_tokens=2048, block_size=128)
    notes = [
        "### Prefix caching: 64 requests sharing a 1,024-token system prompt",
        "",
        f"Medians over {args.rounds} rounds. TTFT p50: caching on {ttft['on']:.0f} ms, off "
        f"{ttft['off']:.0f} ms, **{ttft['off'] / ttft['on']:.2f}x** lower; output throughput "
        f"{tput['on']:.1f} vs {tput['off']:.1f} tok/s (**{tput['on'] / tput['off']:.2f}x**); "
        f"{hits:.0%} of prompt tokens served from the cache. A 2,048-token prompt (16 blocks "
        f"of 128): its block hashes, made when admission first looks it up, {hashing_us:.1f} us; "
        f"the lookup {lookup_us:.1f} us.",
    ]
    return labelled, notes


def prefix_lookup_us(
    prompt_tokens: int, block_size: int, repeats: int = 2000
) -> tuple[float, float]:
    """Median times (us) of hashing a prompt's blocks (once, at its first admission), and
    of KVCacheManager.match_prefix, for a fully cached prompt."""
    ids = np.random.default_rng(0).integers(0, 256, prompt_tokens).tolist()
    kv = KVCacheManager(prompt_tokens // block_size + 1, block_size, prefix_caching=True)
    first = Request("first", 0, "x", ids, max_new_tokens=1)
    kv.allocate_slots(first, prompt_tokens, computed=0)
    kv.cache_computed_blocks(first, prompt_tokens)
    hashing, lookup = [], []
    for i in range(repeats):
        request = Request(f"r{i}", i, "x", ids, max_new_tokens=1)
        start = time.perf_counter()
        kv.block_hashes(request, (prompt_tokens - 1) // block_size)
        middle = time.perf_counter()
        kv.match_prefix(request)
        lookup.append(time.perf_counter() - middle)
        hashing.append(middle - start)
    return float(np.median(hashing)) * 1e6, float(np.median(lookup)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=2048, help="budget outside the sweep")
    parser.add_argument("--rate", type=float, default=0.5, help="latency: requests/s")
    parser.add_argument("--latency-requests", type=int, default=32)
    parser.add_argument("--sweep", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--sweep-requests", type=int, default=32)
    parser.add_argument("--chunk-budget", type=int, default=256, help="long_prompts: chunked")
    parser.add_argument("--rounds", type=int, default=2, help="long_prompts: runs of each")
    parser.add_argument("--profile", type=Path, help="pyinstrument text profile of the runs")
    args = parser.parse_args()

    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler()
        profiler.start()
    runs: list[tuple[str, ServedRun]] = []
    notes: list[str] = []
    for name in SCENARIOS if args.scenario == "all" else (args.scenario,):
        scenario_runs, scenario_notes = run_scenario(name, args)
        runs += scenario_runs
        notes += ["", *scenario_notes] if scenario_notes else []
        print("\n".join(run_table(scenario_runs)[2:]), flush=True)
    if profiler:
        profiler.stop()
        write_report(args.profile, profiler.output_text(unicode=True, show_all=False))

    text = "\n".join(
        [
            "# Benchmarks",
            "",
            machine_line(runs[0][1].matmul_rate, args.threads),
            "",
            *run_table(runs),
            *notes,
        ]
    )
    print(text)
    if args.out:
        write_report(args.out, text + "\n")


if __name__ == "__main__":
    main()
