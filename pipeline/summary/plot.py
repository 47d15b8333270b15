"""summary.png: a sweep's headline metrics against its numeric swept key.

The x-axis is the first swept key whose values are all numbers (max_tokens, rate), the
other swept keys become series; a sweep of categories alone (hardware) gets one slot per
value. A metric whose values span more than two decades is drawn on a log scale, and a
panel with nothing to show (no value in any job, or every value 0) is left out.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol

from pipeline.run_files import write_file
from stages.arithmetic import ceil_div

# (column, panel title) for summary.png, one panel each.
PANELS = [
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p50_ms", "TPOT p50 (ms)"),
    ("tpot_p90_ms", "TPOT p90 (ms)"),
    ("itl_p99_ms", "ITL p99 (ms)"),
    ("output_throughput", "Output throughput (tok/s)"),
    ("token_utilization", "Token utilization (real / padded)"),
    ("prefix_cache_hit_rate", "Prefix cache hit rate"),
    ("predicted_warmup_s", "Warmup, predicted"),  # in s, min or h as the values need
    ("request_goodput", "Goodput (req/s within SLO)"),
    ("slo_attainment", "SLO attainment"),
]
LOG_SPAN = 100.0  # a metric whose positive values span more than this gets a log y-axis
# a panel whose values spread less than this (relative) starts its y-axis at 0 and says
# the spread: an auto-scaled axis turns 0.1% into a cliff
NARROW = 0.05


def time_unit(seconds: Sequence[float | None]) -> tuple[str, float]:
    """A readable unit for durations in seconds: (name, seconds per unit)."""
    top = max((v for v in seconds if v is not None), default=0.0)
    if top >= 2 * 3600:
        return "h", 3600.0
    return ("min", 60.0) if top >= 120 else ("s", 1.0)


def spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / max of the values, None without two positive values."""
    shown = [v for v in values if v is not None]
    if len(shown) < 2 or max(shown) <= 0:
        return None
    return (max(shown) - min(shown)) / max(shown)


class PlotJob(Protocol):
    num: int
    status: str

    @property
    def override_values(self) -> dict[str, str]: ...

    def value(self, column: str) -> float | None: ...


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


SLO_COLUMNS = ("request_goodput", "slo_attainment")


def shown_panels(jobs: Sequence[PlotJob], slo: bool = False) -> list[tuple[str, str]]:
    """The panels with something to show: a value other than 0 in some job (the SLO's
    only when some job had a bound)."""
    return [
        (column, title)
        for column, title in PANELS
        if (slo or column not in SLO_COLUMNS)
        and any(j.value(column) not in (None, 0) for j in jobs)
    ]


def log_scale(values: Sequence[float | None]) -> bool:
    positive = [v for v in values if v is not None and v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SPAN


def write_plot(
    jobs: Sequence[PlotJob],
    keys: Sequence[str],
    path: Path,
    notes: list[str],
    slo: bool,
    bound: AbstractSet[int] = frozenset(),
) -> None:
    """The shown panels against x_key; the other swept keys' values name the series."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    x = x_key(jobs, keys)
    labels = [j.override_values.get(x, "") if x else str(j.num) for j in jobs]
    distinct = list(dict.fromkeys(labels))
    numbers = as_numbers(distinct)
    position = (
        dict(zip(distinct, numbers, strict=True))
        if numbers is not None
        else {label: float(i) for i, label in enumerate(distinct)}
    )
    series: dict[str, list[tuple[float, PlotJob]]] = {}
    for job, label in zip(jobs, labels, strict=True):
        name = " ".join(f"{k}={job.override_values.get(k, '')}" for k in keys if k != x)
        series.setdefault(name, []).append((position[label], job))
    panels = shown_panels(jobs, slo)
    rows = ceil_div(len(panels) + 2, 4)  # a Pareto panel and the notes after them
    fig, axes = plt.subplots(rows, 4, figsize=(17, 3.75 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax, (column, title) in zip(flat, panels, strict=False):
        _panel(ax, column, title, series, jobs, bound)
        ax.set_xlabel(x or "job")
        _x_axis(ax, numbers, position, distinct)
    if len(panels) < len(flat) - 1:
        _pareto(flat[len(panels)], jobs, keys, bound)
        panels = [*panels, ("pareto", "")]
    if len(series) > 1:
        flat[0].legend(fontsize=8)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    flat[-1].text(0.0, 1.0, "\n".join(notes), va="top", fontsize=10, family="monospace", wrap=True)
    fig.suptitle(f"Sweep {path.parent}", fontsize=11)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_file(path, png.getvalue())


def _panel(
    ax: Any,
    column: str,
    title: str,
    series: dict[str, list[tuple[float, PlotJob]]],
    jobs: Sequence[PlotJob],
    bound: AbstractSet[int],
) -> None:
    """One metric against x, each series a line; an arrival-bound job a hollow point."""
    values = [j.value(column) for j in jobs]
    unit, per = time_unit(values) if column.endswith("_s") else ("", 1.0)
    for name, points in series.items():
        points.sort(key=lambda p: p[0])
        ys = [_nan_if_none(job.value(column)) / per for _, job in points]
        line = ax.plot([p for p, _ in points], ys, marker="o", label=name or None)[0]
        hollow = [(p, y) for (p, job), y in zip(points, ys, strict=True) if job.num in bound]
        if hollow:
            ax.scatter(*zip(*hollow, strict=True), s=90, facecolors="white",
                       edgecolors=line.get_color(), zorder=3)  # fmt: skip
    title += f" ({unit})" if unit else ""
    narrow = spread(values)
    if log_scale(values):
        ax.set_yscale("log")
        title += ", log scale"
    elif narrow is not None and narrow < NARROW:
        ax.set_ylim(0, max(v for v in values if v is not None) / per * 1.1)
        title += f"\nspread {narrow:.1%}: y from 0"
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)


def _pareto(ax: Any, jobs: Sequence[PlotJob], keys: Sequence[str], bound: AbstractSet[int]) -> None:
    """Throughput against TPOT p90, each point named by its swept values; the front (no
    other job both faster and lower in TPOT) joined by a line."""
    points = [
        (j.value("tpot_p90_ms"), j.value("output_throughput"), j)
        for j in jobs
        if j.value("tpot_p90_ms") is not None and j.value("output_throughput") is not None
    ]
    if not points:
        ax.axis("off")
        return
    for tpot, rate, job in points:
        ax.scatter([tpot], [rate], facecolors="white" if job.num in bound else "C0",
                   edgecolors="C0", s=50)  # fmt: skip
        name = " ".join(f"{k}={job.override_values.get(k, '')}" for k in keys) or str(job.num)
        ax.annotate(name, (tpot, rate), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = sorted(
        (t, r) for t, r, _ in points
        if not any(t2 <= t and r2 >= r and (t2, r2) != (t, r) for t2, r2, _ in points)
    )  # fmt: skip
    ax.plot(*zip(*front, strict=True), color="C1", alpha=0.6)
    ax.set_xlabel("TPOT p90 (ms)")
    title = "Pareto: throughput (tok/s) vs TPOT p90\nhollow: arrival-bound"
    narrow = spread([r for _, r, _ in points])
    if narrow is not None and narrow < NARROW:
        ax.set_ylim(0, max(r for _, r, _ in points if r is not None) * 1.1)
        title += f"; spread {narrow:.1%}"
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)


def _x_axis(ax: Any, numbers: list[float] | None, position: dict, distinct: list[str]) -> None:
    """Numbers on a linear or (for wide ranges) base-2 log axis; other values as categories."""
    from matplotlib.ticker import NullLocator

    if numbers is None:
        ax.set_xticks(list(position.values()), distinct, rotation=30, ha="right")
        ax.set_xlim(-0.5, len(distinct) - 0.5)
        return
    lo, hi = min(numbers), max(numbers)
    if lo > 0 and hi / lo >= 8:
        ax.set_xscale("log", base=2)  # 256..4096 sweeps read evenly spaced
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(lo / 1.25, hi * 1.25)
    else:
        pad = (hi - lo) * 0.06 or 0.5
        ax.set_xlim(lo - pad, hi + pad)
    ax.set_xticks(sorted(numbers), [_fmt_tick(n) for n in sorted(numbers)])


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _fmt_tick(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"
