"""Published prefill/decode disaggregation gains against the simulator's: for each row of
pipeline/calibrate/data/published-disagg.csv, the goodput per card of the disaggregated
deployment over the best aggregated one's (each a capacity search on the simulated device,
pipeline/plan/capacity.py), the published ratio, the error per row and the median.

    python -m benchmarks.published_disagg [--file CSV] [--requests N] [--record]

Each search serves `--requests` requests of the row's fixed input and output lengths at
Poisson arrivals, under TPOT <= 1000 / tok_s_per_user ms and TTFT <= 2 s (the rows state a
per-user rate, not a TTFT: 2 s is this benchmark's one bound for all rows), attainment
0.9; limits as vLLM's on H100: max_num_seqs=256, max_num_batched_tokens=8192. Nothing
here is fitted to the rows. `--record` writes the median error as the `disaggregation`
result the plan's bands read (pipeline/calibrate/check_results.py).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.calibrate.check_results import command_line, record
from pipeline.compose import compose_config
from pipeline.disagg_config import deployment_cards
from pipeline.plan.capacity import capacity_search

DATA = Path(__file__).resolve().parents[1] / "pipeline/calibrate/data/published-disagg.csv"
TTFT_MS = 2000.0


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of the file, its comment lines left out."""
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def base_overrides(row: dict[str, str], requests: int) -> list[str]:
    isl, osl = int(row["input_tokens"]), int(row["output_tokens"])
    return [
        "executor=simulated", f"hardware={row['hardware']}", f"model=spec/{row['model']}",
        f"quantization={row['quantization']}", "warmup=true", "max_num_seqs=256",
        "max_tokens=8192", f"max_model_len={isl + osl + 256}", "workload=synthetic",
        f"workload.num_requests={requests}", f"workload.min_prompt_tokens={isl}",
        f"workload.max_prompt_tokens={isl}", f"workload.min_new_tokens={osl}",
        f"workload.max_new_tokens={osl}", "workload.rate=1",
        f"slo.tpot_ms={1000.0 / float(row['tok_s_per_user']):.4g}", f"slo.ttft_ms={TTFT_MS:g}",
        "capacity.max_probes=14",
    ]  # fmt: skip


def goodput_per_card(overrides: Sequence[str]) -> float:
    """Requests/s within the SLO per card, at the configuration's capacity (0: none)."""
    cfg = compose_config(list(overrides))
    with tempfile.TemporaryDirectory() as folder:
        result = capacity_search(cfg, Path(folder))
    if not result.get("capacity_found"):
        return 0.0
    return result["capacity_rps"] * (result.get("slo_attainment") or 0.0) / deployment_cards(cfg)


def predict(row: dict[str, str], requests: int) -> dict[str, Any]:
    """The row's predicted ratio: disaggregated goodput per card / the best aggregated's."""
    base = base_overrides(row, requests)
    aggregated = {
        int(tp): goodput_per_card([*base, f"tp={tp}"]) for tp in row["aggregated_tp"].split()
    }
    pools = [
        f"disagg.prefill={row['prefill']}", f"disagg.prefill_tp={row['prefill_tp']}",
        f"disagg.decode={row['decode']}", f"disagg.decode_tp={row['decode_tp']}",
    ]  # fmt: skip
    disaggregated = goodput_per_card([*base, *pools])
    best_tp = max(aggregated, key=lambda tp: aggregated[tp])
    best = aggregated[best_tp]
    ratio = disaggregated / best if best else float("inf")
    return {"aggregated": aggregated, "best_tp": best_tp, "disaggregated": disaggregated,
            "ratio": ratio, "error": ratio / float(row["ratio"]) - 1}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA), help="a published-disagg CSV")
    parser.add_argument("--requests", type=int, default=200, help="requests per probe")
    parser.add_argument("--record", action="store_true", help="write the result for the bands")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    errors, devices = [], []
    for row in read_rows(args.file):
        p = predict(row, args.requests)
        errors.append(abs(p["error"]))
        devices.append(row["hardware"])
        agg = ", ".join(f"tp{tp} {g:.3f}" for tp, g in p["aggregated"].items())
        print(
            f"{row['id']}: {row['hardware']} {row['model']} {row['quantization']} "
            f"{row['input_tokens']}/{row['output_tokens']} at {row['tok_s_per_user']} tok/s/user, "
            f"{row['prefill']}x tp{row['prefill_tp']} prefill + {row['decode']}x "
            f"tp{row['decode_tp']} decode\n"
            f"  goodput per card (req/s): aggregated {agg}; disaggregated "
            f"{p['disaggregated']:.3f}\n"
            f"  ratio predicted {p['ratio']:.2f}, published {float(row['ratio']):.2f}: "
            f"error {p['error']:+.0%}"
        )
    print(
        f"\n{len(errors)} rows: median absolute error {statistics.median(errors):.0%} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    if args.record:
        command = command_line("benchmarks.published_disagg", argv)
        print(f"recorded {record('disaggregation', errors, devices, args.file, command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
