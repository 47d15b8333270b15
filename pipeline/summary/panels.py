"""What a sweep's figures show, for summary.png and report.html alike: the panels, the
x-axis, the series, and the Pareto front of throughput against TPOT p90.

The x-axis is the first swept key whose values are all numbers (max_tokens, rate), the
other swept keys become series; a sweep of categories alone (hardware) gets one slot per
value. A panel with nothing to show (no value in any job, or every value 0) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

# (column, panel title), one panel each; a duration's unit is chosen by its values (unit_of).
PANELS = [
    ("ttft_p50_ms", "TTFT p50"),
    ("ttft_p90_ms", "TTFT p90"),
    ("ttft_p99_ms", "TTFT p99"),
    ("tpot_p50_ms", "TPOT p50"),
    ("tpot_p90_ms", "TPOT p90"),
    ("itl_p99_ms", "ITL p99"),
    ("output_throughput", "Output throughput (tok/s)"),
    ("token_utilization", "Token utilization (real / padded)"),
    ("prefix_cache_hit_rate", "Prefix cache hit rate"),
    ("predicted_warmup_s", "Warmup, predicted"),  # in s, min or h as the values need
    ("request_goodput", "Goodput (req/s within SLO)"),
    ("slo_attainment", "SLO attainment"),
]
SLO_COLUMNS = ("request_goodput", "slo_attainment")
# The Pareto panel: throughput (higher is better) against TPOT p90 (lower is better).
PARETO_X, PARETO_Y = "tpot_p90_ms", "output_throughput"


class PlotJob(Protocol):
    num: int
    status: str

    @property
    def override_values(self) -> dict[str, str]: ...

    def value(self, column: str) -> float | None: ...

    def ends(self, column: str) -> tuple[float, float] | None: ...


Plotted = TypeVar("Plotted", bound=PlotJob)


def time_unit(seconds: Sequence[float | None]) -> tuple[str, float]:
    """A readable unit for durations in seconds: (name, seconds per unit)."""
    top = max((v for v in seconds if v is not None), default=0.0)
    if top >= 2 * 3600:
        return "h", 3600.0
    return ("min", 60.0) if top >= 120 else ("s", 1.0)


def unit_of(column: str, values: Sequence[float | None]) -> tuple[str, float]:
    """A readable unit for a column's figures: (name, the column's units per shown unit).
    Milliseconds stay ms below 10 s; seconds go to min or h as the values need."""
    if column.endswith("_ms"):
        top = max((v for v in values if v is not None), default=0.0)
        if top < 10_000:
            return "ms", 1.0
        unit, per = time_unit([None if v is None else v / 1000 for v in values])
        return unit, per * 1000
    return time_unit(values) if column.endswith("_s") else ("", 1.0)


def as_numbers(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def x_key(jobs: Sequence[PlotJob], keys: Sequence[str]) -> str | None:
    """The first swept key whose values are all numbers, else the first swept key."""
    for key in keys:
        if as_numbers([j.override_values.get(key, "") for j in jobs]) is not None:
            return key
    return keys[0] if keys else None


def shown_panels(jobs: Sequence[PlotJob], slo: bool = False) -> list[tuple[str, str]]:
    """The panels with something to show: a value other than 0 in some job (the SLO's
    only when some job had a bound)."""
    return [
        (column, title)
        for column, title in PANELS
        if (slo or column not in SLO_COLUMNS)
        and any(j.value(column) not in (None, 0) for j in jobs)
    ]


def job_label(job: PlotJob, keys: Sequence[str]) -> str:
    """The job's values of the swept keys, `max_tokens=512 block_size=64`; its number
    where nothing was swept."""
    return " ".join(f"{k}={job.override_values.get(k, '')}" for k in keys) or f"job {job.num}"


@dataclass(frozen=True)
class XAxis:
    """The swept key on x, each job's place on it, and the tick labels."""

    key: str | None
    numbers: list[float] | None  # the distinct values as numbers; None: categories
    position: dict[str, float]  # a value's place on the axis
    distinct: list[str]

    def label(self, job: PlotJob) -> str:
        return job.override_values.get(self.key, "") if self.key else str(job.num)

    @property
    def log(self) -> bool:
        """A base-2 log axis for numbers spanning 8x or more: 256..4096 read evenly spaced."""
        if self.numbers is None:
            return False
        lo, hi = min(self.numbers), max(self.numbers)
        return lo > 0 and hi / lo >= 8

    def ticks(self) -> list[tuple[float, str]]:
        """(position, label) of every value, in order."""
        return sorted((at, label) for label, at in self.position.items())


def x_axis(jobs: Sequence[PlotJob], keys: Sequence[str]) -> XAxis:
    key = x_key(jobs, keys)
    labels = [j.override_values.get(key, "") if key else str(j.num) for j in jobs]
    distinct = list(dict.fromkeys(labels))
    numbers = as_numbers(distinct)
    position = (
        dict(zip(distinct, numbers, strict=True))
        if numbers is not None
        else {label: float(i) for i, label in enumerate(distinct)}
    )
    return XAxis(key, numbers, position, distinct)


def series(
    jobs: Sequence[Plotted], keys: Sequence[str], axis: XAxis
) -> dict[str, list[tuple[float, Plotted]]]:
    """The jobs by the other swept keys' values, each series' points in x order."""
    found: dict[str, list[tuple[float, Plotted]]] = {}
    for job in jobs:
        name = " ".join(f"{k}={job.override_values.get(k, '')}" for k in keys if k != axis.key)
        found.setdefault(name, []).append((axis.position[axis.label(job)], job))
    for points in found.values():
        points.sort(key=lambda p: p[0])
    return found


def pareto_points(jobs: Sequence[Plotted]) -> list[Plotted]:
    """The jobs with both of the Pareto panel's figures."""
    return [j for j in jobs if j.value(PARETO_X) is not None and j.value(PARETO_Y) is not None]


def pareto_front(jobs: Sequence[Plotted]) -> list[Plotted]:
    """The jobs no other beats on both throughput and TPOT p90, by TPOT p90."""
    points = pareto_points(jobs)

    def figures(j: Plotted) -> tuple[float, float]:
        return j.value(PARETO_X) or 0.0, j.value(PARETO_Y) or 0.0

    def dominated(j: Plotted) -> bool:
        t, r = figures(j)
        return any(t2 <= t and r2 >= r and (t2, r2) != (t, r) for t2, r2 in map(figures, points))

    return sorted((j for j in points if not dominated(j)), key=figures)
