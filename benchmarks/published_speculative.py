"""Published speculative-decoding speed-ups against the simulated device's predictions.

    python -m benchmarks.published_speculative [--file CSV] [--dataset GSM8K] [--fit] [--record]

The file is pipeline/calibrate/data/published-speculative.csv: each row a speed-up
(generated tokens/s with speculation over without) at one batch size, its source, its
hardware, model and draft (vLLM's chain of `tokens`, or SGLang's `steps`, `topk` and
`draft_tokens`), and the per-position acceptance and proposal rate it was measured with
(from the source's own traces or its stated acceptance length, never fitted to the
speed-up). Its `split` column says which rows fitted the one figure fitted here (the device
profile's `draft_pass_s`, an EAGLE head pass's fixed time: `--fit` searches it on the `fit`
rows) and which are held out.
Each row is served twice on the simulated device, without and with speculation, under
closed-loop load of `batch_size` requests in flight (max_num_seqs the same), every prompt
and output at the dataset's mean lengths; the predicted speed-up is the ratio of the two
output throughputs. The rest of the device profile is conf/hardware/'s, fitted to other
measurements. Prints each row's error and, per split, the median and the worst;
`--record` writes each method's (`speculative_eagle`, `speculative_ngram`, ...) over every
row for the plan's bands (pipeline/calibrate/check_results.py), over every dataset only.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.calibrate.check_results import command_line, record
from pipeline.config.compose import compose_config
from pipeline.executors.simulated import build_simulated_engine
from stages.simulator.device import VirtualClock

DATA = Path(__file__).resolve().parent.parent / "pipeline/calibrate/data/published-speculative.csv"
SPLITS = ("fit", "held_out")


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
    tree = [f"speculative.{key}={row[key]}" for key in ("steps", "topk", "draft_tokens")]
    return [
        f"speculative.method={row['method']}",
        f"speculative.tokens={row['tokens']}",
        f"speculative.acceptance={row['acceptance']}",
        f"speculative.proposal_rate={row.get('proposal_rate') or 1}",
        *[t for t in tree if not t.endswith("=")],
    ]


def throughput(overrides: Sequence[str]) -> float:
    """Output tokens per second of one simulated run."""
    engine, requests = build_simulated_engine(compose_config(overrides), VirtualClock())
    duration = engine.run(requests)
    return sum(len(r.output_ids) for r in requests) / duration


def read_rows(path: str | Path, dataset: str = "") -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if not dataset or r["dataset"] == dataset]


def predict(
    rows: list[dict[str, str]],
    device: Sequence[str] = (),
    plain: dict[tuple[str, ...], float] | None = None,
) -> list[float]:
    """Each row's predicted speed-up (`device`: overrides of the profile's figures that
    speculation alone reads, e.g. a trial hardware.draft_pass_s), the runs without
    speculation kept in `plain` by their overrides and shared between rows and calls."""
    plain = {} if plain is None else plain
    out = []
    for row in rows:
        base = load_overrides(row)
        if tuple(base) not in plain:
            plain[tuple(base)] = throughput(base)
        spec = throughput([*base, *device, *speculation_overrides(row)])
        out.append(spec / plain[tuple(base)])
    return out


def split_summary(rows: list[dict[str, str]], errors: list[float]) -> dict[str, dict[str, Any]]:
    """Per split (fit, held_out): rows, median and worst absolute relative error."""
    out: dict[str, dict[str, Any]] = {}
    for split in SPLITS:
        chosen = [abs(e) for r, e in zip(rows, errors, strict=True) if r["split"] == split]
        if chosen:
            out[split] = {
                "rows": len(chosen),
                "median": statistics.median(chosen),
                "worst": max(chosen),
            }
    return out


def results(path: str | Path = DATA) -> dict[str, dict[str, Any]]:
    """The check's result for the speculative family, per split: what plan bands read."""
    rows = read_rows(path)
    predicted = predict(rows)
    return split_summary(
        rows, [p / float(r["value"]) - 1 for r, p in zip(rows, predicted, strict=True)]
    )


def fit_draft_pass(rows: list[dict[str, str]], low: float = 0.0, high: float = 1e-3) -> float:
    """The draft_pass_s (seconds) that minimises the mean squared log error of the EAGLE
    rows among `rows`: a golden-section search (the error is one-troughed in it)."""
    eagle = [r for r in rows if r["method"] == "eagle"]
    plain: dict[tuple[str, ...], float] = {}

    def loss(seconds: float) -> float:
        predicted = predict(eagle, [f"hardware.draft_pass_s={seconds:.6g}"], plain)
        return statistics.fmean(
            math.log(p / float(r["value"])) ** 2 for r, p in zip(eagle, predicted, strict=True)
        )

    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    while b - a > 2e-5:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
        print(f"  draft_pass_s in [{a:.3g}, {b:.3g}]", flush=True)
    return (a + b) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA), help="a published speculative CSV")
    parser.add_argument("--dataset", default="", help="only this dataset's rows")
    parser.add_argument("--fit", action="store_true", help="search draft_pass_s on the fit rows")
    parser.add_argument("--record", action="store_true", help="write the result for the bands")
    args = parser.parse_args(argv)
    if args.record and args.dataset:
        print("Error: --record needs every row: drop --dataset", file=sys.stderr)
        return 2
    rows = read_rows(args.file, args.dataset)
    if not rows:
        print("Error: no row matches", file=sys.stderr)
        return 2
    if args.fit:
        best = fit_draft_pass([r for r in rows if r["split"] == "fit"])
        print(f"draft_pass_s {best:.4g}")
        return 0
    errors = []
    for row, predicted in zip(rows, predict(rows), strict=True):
        published = float(row["value"])
        errors.append(predicted / published - 1)
        draft = (
            row["tokens"]
            if not row["steps"]
            else f"{row['steps']}/{row['topk']}/{row['draft_tokens']}"
        )
        print(
            f"{row['hardware']} {row['model_preset']} {row['dataset']:<13} "
            f"{row['proposer']:<15} {draft:>7} batch {int(row['batch_size']):>3} ({row['split']}): "
            f"published {published:.2f}x, predicted {predicted:.2f}x ({errors[-1]:+.1%})"
        )
    for split, s in split_summary(rows, errors).items():
        print(f"{split}: {s['rows']} rows, median error {s['median']:.1%}, worst {s['worst']:.1%}")
    magnitudes = [abs(e) for e in errors]
    print(
        f"\nall {len(errors)} rows: median error {statistics.median(magnitudes):.1%}, "
        f"worst {max(magnitudes):.1%}"
    )
    if args.record:
        record_methods(
            rows,
            errors,
            command_line(
                "benchmarks.published_speculative", sys.argv[1:] if argv is None else argv
            ),
        )
    return 0


def record_methods(rows: list[dict[str, str]], errors: list[float], command: str) -> None:
    """Each method's errors over its rows, written for the plan's bands."""
    for method in sorted({r["method"] for r in rows}):
        mine = [
            (e, r["hardware"]) for r, e in zip(rows, errors, strict=True) if r["method"] == method
        ]
        path = record(
            f"speculative_{method}", [e for e, _ in mine], [d for _, d in mine], DATA, command
        )
        print(f"recorded {path}")


if __name__ == "__main__":
    sys.exit(main())
