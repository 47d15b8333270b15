"""Published speculative-decoding speed-ups against the simulated device's predictions.

    python -m benchmarks.published_speculative [--file CSV] [--dataset GSM8K] [--record]

The file is pipeline/calibrate/data/published-speculative.csv: each row a speed-up
(generated tokens/s with speculation over without) at one batch size, its source, its
hardware, model and k, and the per-position acceptance and proposal rate it was measured
with (derived from the source's own traces by benchmarks.spec_acceptance, never fitted to
the speed-up).
Each row is served twice on the simulated device, without and with speculation, under
closed-loop load of `batch_size` requests in flight (max_num_seqs the same), every prompt
and output at the dataset's mean lengths; the predicted speed-up is the ratio of the two
output throughputs. No constant is tuned to these rows: the device profile is the one in
conf/hardware/, fitted to other measurements. Prints each row's error and the median;
`--record` writes each method's (`speculative_mtp`, `speculative_ngram`) for the plan's
bands (pipeline/calibrate/check_results.py), over every dataset only.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.calibrate.check_results import command_line, record
from pipeline.compose import compose_config
from pipeline.executors.simulated import build_simulated_engine
from stages.simulator.device import VirtualClock

DATA = Path(__file__).resolve().parent.parent / "pipeline/calibrate/data/published-speculative.csv"


def load_overrides(row: dict[str, str]) -> list[str]:
    """The row's deployment and load, without speculation."""
    batch = int(row["batch_size"])
    prompt, output = int(row["input_tokens"]), int(row["output_tokens"])
    return [
        "executor=simulated",
        f"hardware={row['hardware']}",
        f"model=spec/{row['model_preset']}",
        f"tp={row['tp']}",
        "workload=synthetic",
        f"workload.num_requests={max(8, 3 * batch)}",
        f"workload.concurrency={batch}",
        f"workload.min_prompt_tokens={prompt}",
        f"workload.max_prompt_tokens={prompt}",
        f"workload.min_new_tokens={output}",
        f"workload.max_new_tokens={output}",
        f"max_num_seqs={batch}",
        "max_tokens=8192",
        "max_model_len=4096",
        "block_size=32",
        "prefix_caching=false",
    ]


def speculation_overrides(row: dict[str, str]) -> list[str]:
    return [
        f"speculative.method={row['method']}",
        f"speculative.tokens={row['tokens']}",
        f"speculative.acceptance={row['acceptance']}",
        f"speculative.proposal_rate={row.get('proposal_rate') or 1}",
    ]


def throughput(overrides: Sequence[str]) -> float:
    """Output tokens per second of one simulated run."""
    engine, requests = build_simulated_engine(compose_config(overrides), VirtualClock())
    duration = engine.run(requests)
    return sum(len(r.output_ids) for r in requests) / duration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA), help="a published speculative CSV")
    parser.add_argument("--dataset", default="", help="only this dataset's rows")
    parser.add_argument("--record", action="store_true", help="write the result for the bands")
    args = parser.parse_args(argv)
    if args.record and args.dataset:
        print("Error: --record needs every row: drop --dataset", file=sys.stderr)
        return 2
    with open(args.file, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if not args.dataset or r["dataset"] == args.dataset]
    plain: dict[tuple[str, ...], float] = {}
    errors: list[float] = []
    by_method: dict[str, list[tuple[float, str]]] = {}
    for row in rows:
        base = load_overrides(row)
        if tuple(base) not in plain:
            plain[tuple(base)] = throughput(base)
        predicted = throughput(base + speculation_overrides(row)) / plain[tuple(base)]
        published = float(row["value"])
        errors.append(predicted / published - 1)
        by_method.setdefault(row["method"], []).append((errors[-1], row["hardware"]))
        print(
            f"{row['hardware']} {row['model_preset']} {row['dataset']:<13} "
            f"{row['proposer']:<15} k={row['tokens']} batch {int(row['batch_size']):>3}: "
            f"published {published:.2f}x, predicted {predicted:.2f}x ({errors[-1]:+.1%})"
        )
    if not errors:
        print("Error: no row matches", file=sys.stderr)
        return 2
    magnitudes = [abs(e) for e in errors]
    print(
        f"\nall {len(errors)} rows: median error {statistics.median(magnitudes):.1%}, "
        f"worst {max(magnitudes):.1%}"
    )
    if args.record:
        command = command_line("benchmarks.published_speculative", argv)
        for method, found in by_method.items():
            signed, devices = [e for e, _ in found], [d for _, d in found]
            path = record(f"speculative_{method}", signed, devices, args.file, command)
            print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
