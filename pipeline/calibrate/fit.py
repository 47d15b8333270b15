"""`python -m pipeline.calibrate --published FILE hardware=NAME`: fit a device profile to
published throughput figures (`hardware=h100,h200`: several devices fitted together).

Each of the device's rows is simulated once in its method (pipeline.calibrate.published) with its
steps' amounts recorded (`--cache DIR` keeps them for the next fit: pipeline.calibrate.recorded);
a trial profile then re-times those steps (the schedule of a run whose requests are all
there at the start does not depend on the device's speed). The fitted figures are what a
device's hardware decides and the spec sheet does not say: the achieved fractions of peak
of GEMMs, attention and memory, the per-step host overhead, a GEMM's fixed fill time, and
an all-reduce's latency and the link's efficiency (only where some row runs tp > 1).
Devices fitted together share each figure but their memory's efficiency: H100 and H200
are one compute die with different memory, so their 40 rows fit one set of compute and
overhead figures, each device with its own bandwidth. A pattern search over the figures'
logarithms minimises the mean squared log error of the rows' throughput, with a weak pull
towards the starting profiles so that a figure the rows barely constrain stays where the
profile put it. The split-half check fits one model's rows and reports the error on the
other's, both ways.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

from pipeline.calibrate.profile_yaml import profile_fields, spec_sheet_comments
from pipeline.calibrate.published import DATA_DIR, PublishedRow, median, read_rows
from pipeline.calibrate.recorded import Recorded, record
from pipeline.calibrate.residuals import Half, profile_errors, sources
from pipeline.command import ArgparseCommand, Failure
from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from pipeline.run_folder.run_files import RunFolderError, write_file
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
# Fitted together, devices share every figure but this: one compute die (H100 and H200
# are both GH100) behind each its own memory.
OWN_KEYS = ("memory_efficiency",)
PULL = 1e-3  # weight of the squared log distance from the starting values
START = DATA_DIR / "published-fit-start.yaml"
Profiles = dict[str, HardwareProfile]


def log_errors(recorded: Sequence[Recorded], profiles: Mapping[str, HardwareProfile]) -> np.ndarray:
    return np.array(
        [math.log(r.predicted(profiles[r.row.hardware]) / r.row.value) for r in recorded]
    )


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


@dataclass(frozen=True)
class Parameter:
    """One fitted figure: of every device (shared) or of one (`device`)."""

    key: str
    device: str | None = None

    def applies_to(self, device: str) -> bool:
        return self.device is None or self.device == device


def parameters(recorded: Sequence[Recorded], devices: Sequence[str]) -> list[Parameter]:
    """The figures to fit: shared by the devices but each device's own OWN_KEYS."""
    keys = fitted_keys([r.row for r in recorded])
    shown = [d for d in devices if any(r.row.hardware == d for r in recorded)]
    found = []
    for key in keys:
        own = key in OWN_KEYS and len(shown) > 1
        found += [Parameter(key, d) for d in shown] if own else [Parameter(key)]
    return found


def fit(recorded: Sequence[Recorded], starts: Mapping[str, HardwareProfile]) -> Profiles:
    """Profiles (by device name) that minimise the rows' mean squared log error, with a
    weak pull towards `starts`."""
    chosen = parameters(recorded, list(starts))

    def start_log(p: Parameter) -> float:
        devices = [p.device] if p.device else list(starts)
        return float(np.mean([math.log(getattr(starts[d], p.key)) for d in devices]))

    origin = np.array([start_log(p) for p in chosen])
    low = np.log([BOUNDS[p.key][0] for p in chosen])
    high = np.log([BOUNDS[p.key][1] for p in chosen])

    def profiles(x: np.ndarray) -> Profiles:
        values = np.exp(x).tolist()
        return {
            name: dataclasses.replace(
                start,
                **{p.key: v for p, v in zip(chosen, values, strict=True) if p.applies_to(name)},
            )
            for name, start in starts.items()
        }

    def loss(x: np.ndarray) -> float:
        errors = log_errors(recorded, profiles(x))
        return float(np.mean(errors**2) + PULL * np.sum((x - origin) ** 2))

    return profiles(pattern_search(loss, np.clip(origin, low, high), low, high))


def errors_of(recorded: Sequence[Recorded], profiles: Mapping[str, HardwareProfile]) -> list[float]:
    return [r.error(profiles[r.row.hardware]) for r in recorded]


def describe(errors: Sequence[float]) -> str:
    absolute = [abs(e) for e in errors]
    return f"median {median(absolute):.1%}, worst {max(absolute):.1%}"


def per_device(recorded: Sequence[Recorded], profiles: Mapping[str, HardwareProfile]) -> str:
    """Each device's rows' error, or the one device's."""
    parts = []
    for name in dict.fromkeys(r.row.hardware for r in recorded):
        mine = [r for r in recorded if r.row.hardware == name]
        parts.append(f"{name} {len(mine)} rows: {describe(errors_of(mine, profiles))}")
    return "; ".join(parts)


def split_half(
    recorded: Sequence[Recorded], starts: Mapping[str, HardwareProfile]
) -> tuple[list[str], list[Half]]:
    """Fit on each model's rows, check on the other's: a line for each half, and the halves
    (their fits, for the profile's held-out errors)."""
    models = sorted({r.row.model_preset for r in recorded})
    if len(models) < 2:
        return ["split-half: the rows hold one model only"], []
    lines, halves = [], []
    for model in models:
        inside = [r for r in recorded if r.row.model_preset == model]
        outside = [r for r in recorded if r.row.model_preset != model]
        fitted = fit(inside, starts)
        halves.append(Half(model, outside, fitted))
        lines.append(
            f"fit on {model} ({per_device(inside, fitted)}); "
            f"held out: {per_device(outside, fitted)}"
        )
    return lines, halves


def profile_text(
    name: str,
    fitted: Mapping[str, HardwareProfile],
    recorded: Sequence[Recorded],
    command: str,
    checks: Sequence[str],
    halves: Sequence[Half] = (),
) -> str:
    """The device's fitted profile as YAML, its comments naming the rows it was fitted to,
    their errors and the split-half check; its `errors` field those errors by method, its
    `software` the rows' sources where the starting profile names no release."""
    lines = spec_sheet_comments(name)
    lines += _fit_comments(name, fitted, recorded, command, checks)
    lines += ["defaults:", "  - /schema/hardware@_here_: device"]
    profile = dataclasses.replace(
        fitted[name],
        errors=profile_errors(name, fitted, recorded, halves),
        software=fitted[name].software or sources(name, recorded),
    )
    lines += profile_fields(profile)
    return "\n".join(lines) + "\n"


def _fit_comments(
    name: str,
    fitted: Mapping[str, HardwareProfile],
    recorded: Sequence[Recorded],
    command: str,
    checks: Sequence[str],
) -> list[str]:
    """The comments of a fitted profile: when and how it was fitted, which parameters,
    each row with its prediction, and the split-half check."""
    profile = fitted[name]
    mine = [r for r in recorded if r.row.hardware == name]
    errors = errors_of(mine, fitted)
    chosen = parameters(recorded, list(fitted))
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [
        f"# FITTED to published figures on {day}:",
        f"#   {command}",
        f"# Fitted: {', '.join(dict.fromkeys(p.key for p in chosen))};",
        "# the rest are spec-sheet figures or guesses.",
    ]
    others = [d for d in fitted if d != name]
    if others:
        own = ", ".join(dict.fromkeys(p.key for p in chosen if p.device))
        lines.append(
            f"# Fitted together with {', '.join(others)}'s rows: one figure each for all, but "
            f"{own or 'none'} (each device's own)."
        )
    lines.append(f"# Rows ({len(mine)}; {describe(errors)}):")
    for source in dict.fromkeys(r.row.source for r in mine):
        lines.append(f"#  {source}:")
        lines += [
            f"#   {r.row.label}: {r.row.value:.0f} tok/s, predicted "
            f"{r.predicted(profile):.0f} ({e:+.1%})"
            for r, e in zip(mine, errors, strict=True)
            if r.row.source == source
        ]
    for check in checks:
        fitted_on, _, held_out = check.partition("; held out: ")
        lines.append(f"# Split-half: {fitted_on}")
        lines += [f"#   held out: {held_out}"] if held_out else []
    return lines


def devices_and_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """`hardware=h100,h200` names devices fitted together; the other overrides apply to
    each."""
    named = [o for o in overrides if o.startswith("hardware=")]
    if len(named) != 1:
        raise ValueError("give one hardware=NAME (or hardware=NAME,NAME to fit them together)")
    devices = [d for d in named[0].removeprefix("hardware=").split(",") if d]
    if not devices or len(set(devices)) != len(devices):
        raise ValueError(f"{named[0]}: name each device once")
    return devices, [o for o in overrides if o not in named]


def starting_figures(path: str | Path) -> dict[str, dict[str, float]]:
    """The start file's figures per device (pipeline/calibrate/data/published-fit-start.yaml)."""
    data = yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"--start {path}: not a mapping of devices to fitted figures")
    for name, figures in data.items():
        unknown = sorted(set(figures) - set(BOUNDS))
        if unknown:
            raise ValueError(f"--start {path}: {name}: {', '.join(unknown)} are not fitted")
    return {str(k): {str(f): float(v) for f, v in d.items()} for k, d in data.items()}


def starting_profiles(
    devices: Sequence[str], overrides: Sequence[str], start: str | Path
) -> Profiles:
    """Each device's profile with its fitted figures set to where a fit starts."""
    figures = starting_figures(start)
    profiles = {}
    for name in devices:
        cfg = compose_config(["executor=simulated", f"hardware={name}", *overrides])
        profiles[name] = dataclasses.replace(build(cfg.hardware), **figures.get(name, {}))
    return profiles


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.calibrate --published FILE",
        description="Fit device profiles to published throughput figures.",
    )
    parser.add_argument("--published", required=True, help="a published-measurements CSV")
    parser.add_argument(
        "--out",
        default="{name}.yaml",
        help="the profile YAML to write; {name} stands for the device (default: {name}.yaml)",
    )
    parser.add_argument("--cache", help="a folder keeping each row's simulated steps")
    parser.add_argument(
        "--start",
        default=str(START),
        help="each device's starting figures, the weak pull's target (default: %(default)s)",
    )
    parser.add_argument("--no-split", action="store_true", help="skip the split-half check")
    parser.add_argument(
        "overrides", nargs="*", help="hardware=NAME or hardware=NAME,NAME (fitted together)"
    )
    return parser


class FitInputError(Exception):
    """A bad file or override: one line, exit 2."""


def fit_inputs(args: argparse.Namespace) -> tuple[list[str], list[PublishedRow], Profiles]:
    """The devices, their rows and their starting profiles; any error a FitInputError."""
    try:
        devices, overrides = devices_and_overrides(args.overrides)
        if len(devices) > 1 and "{name}" not in args.out:
            raise ValueError(f"--out {args.out}: with several devices, name it with {{name}}")
        starts = starting_profiles(devices, overrides, args.start)
        rows = [r for r in read_rows(args.published) if r.hardware in starts]
        missing = sorted(set(devices) - {r.hardware for r in rows})
        if missing:
            raise ValueError(f"{args.published} has no rows for hardware={','.join(missing)}")
    except Exception as err:
        raise FitInputError(str(err)) from err
    return devices, rows, starts


def fit_published(args: argparse.Namespace, argv: list[str]) -> int:
    """Fits, prints each step's errors and writes each device's profile."""
    devices, rows, starts = fit_inputs(args)
    recorded = record(rows, starts, args.cache)
    print(f"{len(rows)} rows; as given: {per_device(recorded, starts)}")
    fitted = fit(recorded, starts)
    print(f"fitted: {per_device(recorded, fitted)}")
    checks, halves = ([], []) if args.no_split else split_half(recorded, starts)
    for line in checks:
        print(f"split-half: {line}")
    command = " ".join(["python -m pipeline.calibrate", *argv])
    for name in devices:
        out = Path(args.out.format(name=name))
        write_file(out, profile_text(name, fitted, recorded, command, checks, halves))
        print(f"wrote {out}: hardware=measured hardware.path={out}")
    return 0


FIT = ArgparseCommand(
    name="pipeline.calibrate --published",
    parser=build_parser,
    run=fit_published,
    failures=(Failure((FitInputError, RunFolderError), 2),),
)


def main(argv: Sequence[str] | None = None) -> int:
    return FIT.main(argv)
