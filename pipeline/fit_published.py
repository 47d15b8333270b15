"""`python -m pipeline.calibrate --published FILE hardware=NAME`: fit a device profile to
published throughput figures.

Each of the device's rows is simulated once in its method (pipeline.published) with its
steps' amounts recorded; a trial profile then re-times those steps (the schedule of a run
whose requests are all there at the start does not depend on the device's speed). The
fitted figures are what a device's hardware decides and the spec sheet does not say: the
achieved fractions of peak of GEMMs, attention and memory, the per-step host overhead, a
GEMM's fixed fill time, and an all-reduce's latency and the link's efficiency (only where
some row runs tp > 1). A
pattern search over their logarithms minimises the mean squared log error of the rows'
throughput, with a weak pull towards the profile's starting values so that a figure the
rows barely constrain stays where the profile put it. The split-half check fits one
model's rows and reports the error on the other's, both ways.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from pipeline.build import build
from pipeline.compose import compose_config
from pipeline.published import PublishedRow, RowRun, median, read_rows, simulate_row
from stages.simulator.cost_model import StepAmounts
from stages.simulator.hardware import HardwareProfile

# Each fitted figure and its bounds: achieved fractions of peak, and seconds.
BOUNDS = {
    "gemm_efficiency": (0.05, 1.0),
    "attention_efficiency": (0.05, 1.0),
    "memory_efficiency": (0.05, 1.0),
    "step_overhead_s": (1e-5, 0.05),
    "gemm_fill_s": (1e-7, 1e-4),
    "allreduce_latency_s": (1e-6, 5e-4),
    "interconnect_efficiency": (0.05, 1.0),
}
LINK_KEYS = ("allreduce_latency_s", "interconnect_efficiency")  # told only by tp > 1 rows
PULL = 1e-3  # weight of the squared log distance from the starting values
CONF = Path(__file__).resolve().parents[1] / "conf" / "hardware"


@dataclass
class Recorded:
    """A row's simulated steps, ready to re-time."""

    run: RowRun
    amounts: StepAmounts
    compiles: int

    def predicted(self, hardware: HardwareProfile) -> float:
        seconds = float(self.run.cost.on(hardware).seconds_of(self.amounts).sum())
        return self.run.output_tokens / (seconds + self.compiles * hardware.recompile_s)


def record(rows: Sequence[PublishedRow], hardware: HardwareProfile | None) -> list[Recorded]:
    recorded = []
    for row in rows:
        run = simulate_row(row, hardware, record=True)
        amounts = StepAmounts.stack([a for a, _ in run.steps])
        recorded.append(Recorded(run, amounts, sum(n for _, n in run.steps)))
    return recorded


def log_errors(recorded: Sequence[Recorded], hardware: HardwareProfile) -> np.ndarray:
    return np.array([math.log(r.predicted(hardware) / r.run.row.value) for r in recorded])


def fitted_keys(rows: Sequence[PublishedRow]) -> list[str]:
    """The figures the rows can tell: the all-reduce's only where some row has tp > 1."""
    if all(row.tp == 1 for row in rows):
        return [k for k in BOUNDS if k not in LINK_KEYS]
    return list(BOUNDS)


def pattern_search(
    loss: Callable[[np.ndarray], float],
    start: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    max_evals: int = 600,
) -> np.ndarray:
    """Derivative-free: try each coordinate up and down by a step, keep what lowers the
    loss, halve the step when nothing does."""
    x, best = start.copy(), loss(start)
    step, evals = math.log(2.0), 1
    while step > 0.005 and evals < max_evals:
        improved = False
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                trial = x.copy()
                trial[i] = np.clip(x[i] + sign * step, low[i], high[i])
                if trial[i] == x[i]:
                    continue
                value = loss(trial)
                evals += 1
                if value < best:
                    x, best, improved = trial, value, True
                    break
        if not improved:
            step /= 2
    return x


def fit(recorded: Sequence[Recorded], start: HardwareProfile) -> HardwareProfile:
    keys = fitted_keys([r.run.row for r in recorded])
    origin = np.log([getattr(start, k) for k in keys])
    low = np.log([BOUNDS[k][0] for k in keys])
    high = np.log([BOUNDS[k][1] for k in keys])

    def profile(x: np.ndarray) -> HardwareProfile:
        return dataclasses.replace(start, **dict(zip(keys, np.exp(x).tolist(), strict=True)))

    def loss(x: np.ndarray) -> float:
        errors = log_errors(recorded, profile(x))
        return float(np.mean(errors**2) + PULL * np.sum((x - origin) ** 2))

    return profile(pattern_search(loss, np.clip(origin, low, high), low, high))


def errors_of(recorded: Sequence[Recorded], hardware: HardwareProfile) -> list[float]:
    return [r.predicted(hardware) / r.run.row.value - 1 for r in recorded]


def describe(errors: Sequence[float]) -> str:
    absolute = [abs(e) for e in errors]
    return f"median {median(absolute):.1%}, worst {max(absolute):.1%}"


def split_half(recorded: Sequence[Recorded], start: HardwareProfile) -> list[str]:
    """Fit on each model's rows, check on the other's."""
    models = sorted({r.run.row.model_preset for r in recorded})
    if len(models) < 2:
        return ["split-half: the rows hold one model only"]
    lines = []
    for model in models:
        inside = [r for r in recorded if r.run.row.model_preset == model]
        outside = [r for r in recorded if r.run.row.model_preset != model]
        fitted = fit(inside, start)
        lines.append(
            f"fit on {model} ({len(inside)} rows: {describe(errors_of(inside, fitted))}), "
            f"held-out {len(outside)} rows: {describe(errors_of(outside, fitted))}"
        )
    return lines


def spec_sheet_comments(name: str) -> list[str]:
    """The shipped profile's leading comments, up to what a fit or a guess says."""
    path = CONF / f"{name}.yaml"
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = []
    for line in lines:
        if not line.startswith("#") or line.startswith(("# UNCALIBRATED", "# FITTED")):
            break
        kept.append(line)
    return kept


def profile_text(
    fitted: HardwareProfile,
    recorded: Sequence[Recorded],
    file: str,
    checks: Sequence[str],
) -> str:
    errors = errors_of(recorded, fitted)
    keys = fitted_keys([r.run.row for r in recorded])
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lines = spec_sheet_comments(fitted.name)
    lines += [
        f"# FITTED to published figures on {day}:",
        f"#   python -m pipeline.calibrate --published {file} hardware={fitted.name}",
        f"# Fitted: {', '.join(keys)};",
        "# the rest are spec-sheet figures or guesses.",
        f"# Rows ({len(recorded)}; {describe(errors)}):",
    ]
    for source in dict.fromkeys(r.run.row.source for r in recorded):
        lines.append(f"#  {source}:")
        lines += [
            f"#   {r.run.row.label}: {r.run.row.value:.0f} tok/s, predicted "
            f"{r.predicted(fitted):.0f} ({e:+.1%})"
            for r, e in zip(recorded, errors, strict=True)
            if r.run.row.source == source
        ]
    lines += [f"# Split-half: {c}" for c in checks]
    lines += ["defaults:", "  - /schema/hardware@_here_: device"]
    for f in dataclasses.fields(fitted):
        value = getattr(fitted, f.name)
        if f.name == "coefficients":
            if value:
                lines.append("coefficients:")
                lines += [f"  {k}: {v:.6g}" for k, v in value.items()]
            continue
        shown = str(value).lower() if isinstance(value, bool) else _number(value)
        lines.append(f"{f.name}: {shown}")
    return "\n".join(lines) + "\n"


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) >= 1e-4 or value == 0 else f"{value:.4e}"
    return str(value)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.calibrate --published FILE",
        description="Fit a device profile to published throughput figures.",
    )
    parser.add_argument("--published", required=True, help="a published-measurements CSV")
    parser.add_argument("--out", help="the profile YAML to write (default: NAME.yaml here)")
    parser.add_argument("--no-split", action="store_true", help="skip the split-half check")
    parser.add_argument("overrides", nargs="*", help="hardware=NAME (the profile to start from)")
    args = parser.parse_args(argv)
    try:
        start = build(compose_config(["executor=simulated", *args.overrides]).hardware)
        rows = [r for r in read_rows(args.published) if r.hardware == start.name]
        if not rows:
            raise ValueError(f"{args.published} has no rows for hardware={start.name}")
    except Exception as err:  # a bad file or override: one line, exit 2
        print(f"Error: {err}", file=sys.stderr)
        return 2
    recorded = record(rows, start)
    print(f"{len(rows)} rows of {start.name}; as given: {describe(errors_of(recorded, start))}")
    fitted = fit(recorded, start)
    print(f"fitted: {describe(errors_of(recorded, fitted))}")
    checks = [] if args.no_split else split_half(recorded, start)
    for line in checks:
        print(f"split-half: {line}")
    out = Path(args.out or f"{start.name}.yaml")
    out.write_text(profile_text(fitted, recorded, args.published, checks))
    print(f"wrote {out}: hardware=measured hardware.path={out}")
    return 0
