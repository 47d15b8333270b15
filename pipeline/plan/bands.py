"""Error bands of predicted figures, from the device profile's own calibration residuals.

A fitted profile (conf/hardware/*.yaml) records, per measurement method it was fitted to
(`offline`: every request queued at once; `static`: one batch in lockstep; `online`: a
load generator's rate or concurrency), the relative errors of its predictions: on the rows
it was fitted to (`fit_median`, `fit_worst`) and on the rows a split-half fit held out
(`held_out_median`, `held_out_worst`). A plan's figure is one more prediction on rows
nobody fitted, so its band is +- the held-out median error: of the `online` method where
the profile has one (a plan serves a load as a benchmark client does), else the largest of
its other methods' (an online figure is no better known than the least known offline one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ONLINE = "online"


@dataclass(frozen=True)
class Band:
    """+- `relative` around a predicted figure; `method` says which residuals gave it."""

    relative: float
    method: str
    software: str = ""  # the software release the profile's figures describe

    def ends(self, value: float) -> tuple[float, float]:
        return value * (1 - self.relative), value * (1 + self.relative)

    def describe(self) -> str:
        if not self.method:
            return "no calibration residuals: no band"
        return f"+-{self.relative:.0%} ({self.method} held-out median error)"


NO_BAND = Band(0.0, "")


def profile_band(hardware: Mapping[str, Any] | None) -> Band:
    """The band of a profile (a resolved config's `hardware` node)."""
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
    if ONLINE in medians:
        return Band(medians[ONLINE], ONLINE, software)
    method = max(medians, key=lambda m: medians[m])
    return Band(medians[method], method, software)
