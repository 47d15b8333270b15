"""Error bands of predicted figures: the one place a figure's band comes from.

A band is a factor f around a predicted value: the truth lies within value / f ..
value x f. It compounds what the project's own checks measured for what the configuration
uses:

- **the device** (dense serving in the precision its published rows were measured in): the
  device profile's held-out calibration error (`hardware.errors` in conf/hardware/*.yaml:
  the median error of the predictions a split-half fit did not see; `online` where the
  profile has it, else the largest of its other methods');
- **each feature** the configuration adds: attention DP (dp > 1), expert parallelism at
  dp = 1, prefill/decode disaggregation, speculative decoding by its method: the median
  error the published check of that feature measured (`python -m benchmarks.published_moe`,
  `published_disagg`, `published_speculative` with `--record`, read from the files they
  write: pipeline/calibrate/check_results.py);
- **the precision**: checked where the device's published rows
  (pipeline/calibrate/data/published-measurements.csv, which its profile was fitted to)
  were measured in the configuration's quantization.

A feature or precision no check covers is "unchecked" and takes the widest band any check
measured (the largest median error of all recorded features). f = (1 + device error) x
prod(1 + feature error).

Public: `config_band(config)` (a run's or a plan row's resolved config) and
`band_of(hardware, features)`, both returning a `Band` (`relative` = f - 1, `ends(value)`,
`describe()`); `features_of(config)` names what a config uses.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.calibrate.check_results import CHECKS_DIR, CheckResult, read_results
from pipeline.config.layout import layout_of

ONLINE = "online"
MEASUREMENTS = Path(__file__).resolve().parents[1] / "calibrate/data/published-measurements.csv"


@dataclass(frozen=True)
class Band:
    """value / (1 + relative) .. value x (1 + relative); `method` says which residuals gave
    the device's part, `parts` each contribution, `unchecked` what no check covers."""

    relative: float
    method: str
    software: str = ""  # the software release the profile's figures describe
    parts: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()

    def ends(self, value: float) -> tuple[float, float]:
        factor = 1 + self.relative
        return value / factor, value * factor

    def describe(self) -> str:
        if not self.method and not self.parts:
            return "no calibration residuals: no band"
        text = f"+-{self.relative:.0%} (/ x {1 + self.relative:.2f}: " + "; ".join(self.parts) + ")"
        if self.unchecked:
            text += f"; unchecked: {', '.join(self.unchecked)}"
        return text


NO_BAND = Band(0.0, "")


@dataclass(frozen=True)
class Features:
    """What a configuration uses beyond dense serving, as the checks name it."""

    names: tuple[str, ...]  # check_results.FEATURES members, e.g. ("attention_dp",)
    quantization: str = "none"


def features_of(config: Mapping[str, Any]) -> Features:
    """The features of a resolved config (a job's resolved_config.yaml, as a mapping)."""
    layout = layout_of(config)
    dps = [layout.dp]
    if layout.disaggregated:
        dps += [layout.prefill_dp or layout.dp, layout.decode_dp or layout.dp]
    names = []
    if max(dps) > 1:
        names.append("attention_dp")
    elif layout.ep > 1:
        names.append("expert_parallel")
    if layout.disaggregated:
        names.append("disaggregation")
    if layout.speculative != "none":
        names.append(f"speculative_{layout.speculative}")
    return Features(tuple(names), str(config.get("quantization") or "none"))


def profile_band(hardware: Mapping[str, Any] | None) -> Band:
    """The device's part alone (a resolved config's `hardware` node)."""
    if not isinstance(hardware, Mapping):
        return NO_BAND
    software = str(hardware.get("software") or "")
    errors = hardware.get("errors") or {}
    medians = {
        method: float(e["held_out_median"])
        for method, e in errors.items()
        if isinstance(e, Mapping) and e.get("held_out_median") is not None
    }
    if not medians:
        return Band(0.0, "", software)
    method = ONLINE if ONLINE in medians else max(medians, key=lambda m: medians[m])
    name = str(hardware.get("name") or "device")
    part = f"{name} {method} held-out {medians[method]:.0%}"
    return Band(medians[method], method, software, (part,))


def band_of(
    hardware: Mapping[str, Any] | None,
    features: Features,
    checks: Mapping[str, CheckResult] | None = None,
) -> Band:
    """The band of a figure predicted on `hardware` (a resolved config's `hardware` node)
    for a configuration using `features`; `checks`: the recorded results (default: the
    files under pipeline/calibrate/data/published-checks/)."""
    device = profile_band(hardware)
    results = recorded() if checks is None else checks
    widest = max((r.median_error for r in results.values()), default=0.0)
    factor = 1 + device.relative
    parts, unchecked = list(device.parts), []
    name = str(hardware.get("name")) if isinstance(hardware, Mapping) else ""
    if features.quantization not in checked_precisions(name):
        unchecked.append(f"precision quantization={features.quantization}")
    for feature in features.names:
        result = results.get(feature)
        if result is None:
            unchecked.append(feature)
            continue
        factor *= 1 + result.median_error
        parts.append(f"{feature} check {result.median_error:.0%} ({result.rows} rows)")
    for what in unchecked:
        factor *= 1 + widest
        parts.append(f"{what} unchecked {widest:.0%}")
    return Band(factor - 1, device.method, device.software, tuple(parts), tuple(unchecked))


def config_band(config: Mapping[str, Any]) -> Band:
    """The band of a run's or plan row's figures, from its resolved config."""
    return band_of(config.get("hardware"), features_of(config))


@functools.cache
def recorded() -> Mapping[str, CheckResult]:
    """The checks' results as recorded under CHECKS_DIR (read once a process)."""
    return read_results(CHECKS_DIR)


@functools.cache
def checked_precisions(device: str, path: Path = MEASUREMENTS) -> frozenset[str]:
    """The quantizations the device's published rows were measured in."""
    with open(path, newline="", encoding="utf-8") as f:
        rows: Sequence[dict[str, str]] = list(csv.DictReader(f))
    return frozenset(r["quantization"] for r in rows if r["hardware"] == device)
