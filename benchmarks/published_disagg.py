"""Published prefill/decode disaggregation figures against the simulator's, three checks:

- **latency** (published-disagg-latency.csv): a disaggregated deployment's TTFT and ITL as
  its clients measured them, closed loop (benchmarks/disagg_latency.py states the settings
  assumed), with the same engine's aggregated rows beside them as controls;
- **goodput ratio** (published-disagg.csv): the goodput per card of the disaggregated
  deployment over the best aggregated one's (each a capacity search on the simulated
  device, pipeline/plan/capacity.py) against the published ratio;
- **transfer** (published-kv-transfer.csv): a KV transfer's time by its bytes and pieces.

    python -m benchmarks.published_disagg [--file CSV] [--requests N] [--record] [--fit]

Of the latency rows, the `fit` ones set the vLLM 0.6.3 profile's host time a step and GEMM
rate (conf/engine/vllm_v0.yaml; `--fit` finds them again and prints them), the others are
held out (each row on its release's engine profile; the summary
gives each profile's held-out errors too); nothing is fitted to the ratio rows. Of the
transfer rows, two set the per-piece time (`fit`), the others are held out.
`checked_errors(...)` gives each check's fitted and held-out median and worst.

Each search serves `--requests` requests of the row's fixed input and output lengths at
Poisson arrivals, under TPOT <= 1000 / tok_s_per_user ms and TTFT <= 2 s (the rows state a
per-user rate, not a TTFT: 2 s is this benchmark's one bound for all rows), attainment
0.9; limits as vLLM's on H100: max_num_seqs=256, max_num_batched_tokens=8192.
`--record` writes the held-out errors of the disaggregated rows (TTFT, ITL and ratio
together) as the `disaggregation` result the plan's bands read
(pipeline/calibrate/check_results.py).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.disagg_latency import (
    LATENCY,
    TRANSFER,
    LatencyCheck,
    check_latency,
    fit_engine,
    piece_seconds,
    spread,
    transfer_ms,
)
from pipeline.calibrate.check_results import command_line, record
from pipeline.config.compose import compose_config
from pipeline.disagg.config import deployment_cards
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


def checked_errors(
    latency: Sequence[LatencyCheck],
    ratio_errors: Sequence[float],
    transfers: Sequence[tuple[dict[str, str], float]],
) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each check's `fit` and `held_out` median and worst absolute error: TTFT and ITL of
    the disaggregated latency rows (and of all of them, fit and held out, and of the held-out
    ones of each engine profile), the goodput ratios, the transfers (row, predicted ms)."""
    roles = ("fit", "held_out")
    pd = {
        role: [c for c in latency if c.disaggregated and c.row.get("role", "held_out") == role]
        for role in roles
    }
    every_pd = [c for c in latency if c.disaggregated]
    by_profile = {
        f"held_out {profile}": [c for c in pd["held_out"] if c.row.get("profile", "") == profile]
        for profile in sorted({c.row.get("profile", "") for c in pd["held_out"]})
    }
    transfer = {
        role: [ms / float(row["published_ms"]) - 1 for row, ms in transfers if row["role"] == role]
        for role in roles
    }
    return {
        "ttft": {role: spread([c.ttft_error for c in pd[role]]) for role in roles}
        | {"all": spread([c.ttft_error for c in every_pd])}
        | {key: spread([c.ttft_error for c in rows]) for key, rows in by_profile.items()},
        "itl": {role: spread([c.itl_error for c in pd[role]]) for role in roles}
        | {"all": spread([c.itl_error for c in every_pd])}
        | {key: spread([c.itl_error for c in rows]) for key, rows in by_profile.items()},
        "ratio": {"fit": spread([]), "held_out": spread(list(ratio_errors))},
        "transfer": {role: spread(errors) for role, errors in transfer.items()},
    }


def print_latency(checks: Sequence[LatencyCheck]) -> None:
    for c in checks:
        r = c.row
        layout = (
            f"{r['prefill']}x tp{r['prefill_tp']} + {r['decode']}x tp{r['decode_tp']} "
            f"({r['engine']})"
            if c.disaggregated
            else f"aggregated tp{r['tp']} (control)"
        ) + f", engine={r.get('profile') or '-'}, {r.get('role', 'held_out')}"
        parts = " + ".join(f"{k} {v:.1f}" for k, v in c.parts_ms.items())
        print(
            f"{r['id']}: {r['hardware']} {r['model']} {r['quantization']} "
            f"{r['input_tokens']}/{r['output_tokens']} at concurrency {r['concurrency']}, "
            f"{layout}\n  TTFT {c.ttft_ms:.0f} ms, published {float(r['ttft_ms']):.0f}: "
            f"{c.ttft_error:+.0%}; ITL {c.itl_ms:.2f} ms, published {float(r['itl_ms']):.2f}: "
            f"{c.itl_error:+.0%}" + (f"\n  TTFT parts (means, ms): {parts}" if parts else "")
        )


def print_transfers(transfers: Sequence[tuple[dict[str, str], float]], piece_s: float) -> None:
    print(f"\nKV transfers at {piece_s * 1e6:g} us a piece (h100's kv_link_piece_s):")
    for row, ms in transfers:
        published = float(row["published_ms"])
        print(
            f"  {row['id']} ({row['role']}): {int(row['pieces']):,} pieces, "
            f"{int(row['bytes']):,} bytes over {float(row['link_gbps']):g} GB/s: "
            f"{ms:.4g} ms, published {published:.4g}: {ms / published - 1:+.0%}"
        )


def print_summary(errors: dict[str, dict[str, dict[str, float | None]]]) -> None:
    print("\nmedian / worst absolute error:")
    for check, roles in errors.items():
        cells = [
            f"{role} {e['median']:.0%} / {e['worst']:.0%}"
            for role, e in roles.items()
            if e["median"] is not None and e["worst"] is not None
        ]
        print(f"  {check}: {'; '.join(cells)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA), help="a published-disagg CSV (ratios)")
    parser.add_argument("--latency", default=str(LATENCY), help="a latency CSV")
    parser.add_argument("--transfer", default=str(TRANSFER), help="a KV transfer CSV")
    parser.add_argument("--requests", type=int, default=200, help="requests per probe")
    parser.add_argument("--record", action="store_true", help="write the result for the bands")
    parser.add_argument("--fit", action="store_true", help="fit the vLLM 0.6.3 profile's figures")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.fit:
        (step_s, row_s, rate), cost = fit_engine(read_rows(args.latency))
        print(f"step_host_s: {step_s:g}\nrow_host_s: {row_s:g}\ngemm_rate: {rate:g}\n"
              f"(sum of squared errors on the fit rows {cost:.4f}; "
              f"{time.perf_counter() - start:.0f} s)")  # fmt: skip
        return 0
    latency = [check_latency(row) for row in read_rows(args.latency)]
    print_latency(latency)
    print()
    errors, devices = [], []
    for row in read_rows(args.file):
        p = predict(row, args.requests)
        errors.append(p["error"])
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
    piece_s = piece_seconds()
    transfers = [(row, transfer_ms(row, piece_s)) for row in read_rows(args.transfer)]
    print_transfers(transfers, piece_s)
    summary = checked_errors(latency, errors, transfers)
    print_summary(summary)
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.record:
        pd_rows = [
            c for c in latency if c.disaggregated and c.row.get("role", "held_out") == "held_out"
        ]
        held_out = [*(c.ttft_error for c in pd_rows), *(c.itl_error for c in pd_rows), *errors]
        pd_devices = [c.row["hardware"] for c in pd_rows] * 2 + devices  # TTFT's, ITL's
        command = command_line(
            "benchmarks.published_disagg", sys.argv[1:] if argv is None else argv
        )
        path = record("disaggregation", held_out, pd_devices, args.latency, command)
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
