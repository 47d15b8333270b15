"""A fitted profile's own errors, by measurement method, written into the profile
(`hardware.errors`) for the plan's bands (pipeline/plan/bands.py).

Per method of the device's rows (offline, static, online): the median and worst absolute
error of the fitted profile on its rows (`fit_median`, `fit_worst`), and of each split-half
fit on the rows it held out (`held_out_median`: the worse half's median; `held_out_worst`:
the worst of either half).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.calibrate.published import median

if TYPE_CHECKING:
    from pipeline.calibrate.recorded import Recorded
    from stages.simulator.hardware import HardwareProfile


@dataclass(frozen=True)
class Half:
    """One split-half fit: on one model's rows, checked on the others'."""

    model: str
    outside: Sequence[Recorded]
    fitted: Mapping[str, HardwareProfile]


def profile_errors(
    name: str,
    fitted: Mapping[str, HardwareProfile],
    recorded: Sequence[Recorded],
    halves: Sequence[Half],
) -> dict[str, dict[str, float]]:
    """The device's errors by method, as fractions rounded to 4 places."""
    mine = [r for r in recorded if r.row.hardware == name]
    out: dict[str, dict[str, float]] = {}
    for method in dict.fromkeys(str(r.row.mode) for r in mine):
        rows = [r for r in mine if str(r.row.mode) == method]
        fit = [abs(r.error(fitted[name])) for r in rows]
        entry = {"fit_median": median(fit), "fit_worst": max(fit)}
        ids = {id(r) for r in rows}
        held = [
            [abs(r.error(h.fitted[name])) for r in h.outside if id(r) in ids]
            for h in halves
            if name in h.fitted
        ]
        held = [errors for errors in held if errors]
        if held:
            entry["held_out_median"] = max(median(errors) for errors in held)
            entry["held_out_worst"] = max(max(errors) for errors in held)
        out[method] = {k: round(float(v), 4) for k, v in entry.items()}
    return out


def sources(name: str, recorded: Sequence[Recorded]) -> str:
    """The sources of the device's rows: what release its figures describe."""
    return "; ".join(dict.fromkeys(r.row.source for r in recorded if r.row.hardware == name))
