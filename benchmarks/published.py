"""Every published figure of a measurements file simulated in its method, against what was
published: per source and device, each row's predicted and published output throughput,
its error, and the median and worst absolute error.

    python -m benchmarks.published [--file CSV] [--hardware h100,gaudi3] [--model llama31_8b]

The default file is pipeline/calibrate/data/published-measurements.csv (56 rows: TensorRT-LLM's
v1.0 performance overview on H100 and H200, Optimum Habana's SW 1.21 reference numbers on
Gaudi 2 and 3; each row names its source). Offline rows queue every request at once with
trtllm-bench's batch limits; static rows run `scheduler=static` at the row's batch
(pipeline/calibrate/published.py). Each device's profile is conf/hardware/NAME.yaml.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from pipeline.calibrate.published import DATA, error_lines, median, read_rows, simulate_row
from pipeline.config.compose import compose_config
from pipeline.executors.build import build


def results(path: str = str(DATA)) -> dict[str, dict[str, Any]]:
    """The dense family's result, what plan bands read: `fit` the rows as simulated with
    the shipped profiles (each fitted to all of its device's rows), `held_out` the worse of
    each profile's split-half fits (fit on one model, the other held out: its `errors`)."""
    runs = [simulate_row(row) for row in read_rows(path)]
    errors = [abs(r.error) for r in runs]
    held: list[tuple[float, float]] = []
    for device in sorted({r.row.hardware for r in runs}):
        profile = build(compose_config(["executor=simulated", f"hardware={device}"]).hardware)
        held += [(e["held_out_median"], e["held_out_worst"]) for e in profile.errors.values()]
    return {
        "fit": {"rows": len(errors), "median": median(errors), "worst": max(errors)},
        "held_out": {
            "rows": len(errors),
            "median": max(m for m, _ in held),
            "worst": max(w for _, w in held),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA), help="a published-measurements CSV")
    parser.add_argument("--hardware", default="", help="only these devices, comma-separated")
    parser.add_argument("--model", default="", help="only this model preset")
    args = parser.parse_args(argv)
    try:
        rows = read_rows(args.file)
    except ValueError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    devices = set(filter(None, args.hardware.split(",")))
    rows = [
        r
        for r in rows
        if (not devices or r.hardware in devices)
        and (not args.model or r.model_preset == args.model)
    ]
    start, cpu = time.perf_counter(), time.process_time()
    runs = [simulate_row(row) for row in rows]
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print("\n".join(error_lines(runs)))
    errors = [abs(r.error) for r in runs]
    print(
        f"\nall {len(runs)} rows: median error {median(errors):.1%}, worst {max(errors):.1%}; "
        f"simulated in {wall:.1f} s wall, {cpu:.1f} s of this process's CPU (slowest row "
        f"{max(r.wall_s for r in runs):.2f} s wall; 1-minute load average "
        f"{os.getloadavg()[0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
