"""summary.png: a sweep's headline metrics against its swept key (pipeline/summary/panels.py),
each simulated figure with its band as an error bar, every value axis by the one rule of
pipeline/page/axes.py, a Pareto panel, and the notes filling the last row."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pipeline.page.axes import Axis, label_levels, value_axis
from pipeline.run_folder.run_files import write_file
from pipeline.summary.panels import (
    PARETO_X,
    PARETO_Y,
    PlotJob,
    XAxis,
    job_label,
    pareto_front,
    pareto_points,
    series,
    shown_panels,
    unit_of,
    x_axis,
)
from stages.arithmetic import ceil_div

WIDTH, HEIGHT = 4.25, 3.9  # inches a panel
CHARS_A_CELL = 52  # characters of 9-point monospace a panel's width holds


def grid(panels: int) -> tuple[int, int]:
    """(rows, columns) for the panels, the Pareto panel and the notes: the fewest cells
    left over (the notes span what is left of the last row), four columns where even."""
    best: tuple[int, int, int] | None = None
    for cols in (4, 3, 5):
        rows = ceil_div(panels + 2, cols)
        spare = rows * cols - (panels + 1)  # cells the notes span
        if best is None or spare < best[0]:
            best = (spare, rows, cols)
    assert best is not None
    return best[1], best[2]


def write_plot(
    jobs: Sequence[PlotJob],
    keys: Sequence[str],
    path: Path,
    notes: list[str],
    slo: bool,
    bound: AbstractSet[int] = frozenset(),
) -> None:
    """The shown panels against the swept key; the other swept keys' values name the series."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    axis = x_axis(jobs, keys)
    lines = series(jobs, keys, axis)
    panels = shown_panels(jobs, slo)
    rows, cols = grid(len(panels))
    fig = plt.figure(figsize=(WIDTH * cols, HEIGHT * rows))
    spec = fig.add_gridspec(rows, cols)
    cells = [fig.add_subplot(spec[i // cols, i % cols]) for i in range(len(panels) + 1)]
    for ax, (column, title) in zip(cells, panels, strict=False):
        _panel(ax, column, title, lines, jobs, bound)
        ax.set_xlabel(axis.key or "job")
        _x_ticks(ax, axis)
    if len(lines) > 1 and panels:
        cells[0].legend(fontsize=8)
    front = _pareto(cells[-1], jobs, bound)
    at = len(panels) + 1
    text = fig.add_subplot(spec[at // cols, at % cols :])
    text.axis("off")
    notes = [*notes, "", "Pareto front (by TPOT p90):"]
    notes += [f" job {j.num}: {job_label(j, keys)}" for j in front] or [" none"]
    width = CHARS_A_CELL * (cols - at % cols)  # the notes span the rest of the last row
    wrapped = [part for line in notes for part in textwrap.wrap(line, width, subsequent_indent="  ")
               or [""]]  # fmt: skip
    text.text(0.0, 1.0, "\n".join(wrapped), va="top", fontsize=9, family="monospace")
    fig.suptitle(f"Sweep {path.parent}", fontsize=11)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_file(path, png.getvalue())


def _set_axis(ax: Any, axis: Axis, which: str = "y") -> None:
    if axis.log:
        (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    (ax.set_ylim if which == "y" else ax.set_xlim)(axis.start, axis.end)


def _panel(
    ax: Any,
    column: str,
    title: str,
    lines: dict[str, list[tuple[float, PlotJob]]],
    jobs: Sequence[PlotJob],
    bound: AbstractSet[int],
) -> None:
    """One metric against x, each series a line with its bands; an arrival-bound job a
    hollow point."""
    values = [j.value(column) for j in jobs]
    unit, per = unit_of(column, values)
    for name, points in lines.items():
        xs = [p for p, _ in points]
        ys = [_nan_if_none(job.value(column)) / per for _, job in points]
        errors = [_error(job, column, y, per) for (_, job), y in zip(points, ys, strict=True)]
        line = ax.errorbar(xs, ys, yerr=list(zip(*errors, strict=True)), marker="o",
                           capsize=3, label=name or None)[0]  # fmt: skip
        hollow = [(p, y) for (p, job), y in zip(points, ys, strict=True) if job.num in bound]
        if hollow:
            ax.scatter(*zip(*hollow, strict=True), s=90, facecolors="white",
                       edgecolors=line.get_color(), zorder=3)  # fmt: skip
    axis = _axis_of(jobs, column, per)
    _set_axis(ax, axis)
    ax.set_title(f"{title}{f' ({unit})' if unit else ''}\n{axis.note}", fontsize=9)
    ax.grid(True, alpha=0.3)


def _error(job: PlotJob, column: str, y: float, per: float) -> tuple[float, float]:
    """(below, above) the figure: its band's ends, 0 where it has none."""
    ends = job.ends(column)
    if ends is None or math.isnan(y):
        return 0.0, 0.0
    return y - ends[0] / per, ends[1] / per - y


def _axis_of(jobs: Sequence[PlotJob], column: str, per: float = 1.0) -> Axis:
    values = [j.value(column) for j in jobs]
    ends = [e for e in (j.ends(column) for j in jobs) if e is not None]
    return value_axis(
        [None if v is None else v / per for v in values],
        [low / per for low, _ in ends],
        [high / per for _, high in ends],
    )


def _pareto(ax: Any, jobs: Sequence[PlotJob], bound: AbstractSet[int]) -> list[PlotJob]:
    """Throughput against TPOT p90 with both bands, each point its job's number, the front
    (no other job both faster and lower in TPOT) joined by a line; returns the front."""
    points = pareto_points(jobs)
    if not points:
        ax.axis("off")
        return []
    from matplotlib.ticker import MaxNLocator

    unit, per = unit_of(PARETO_X, [j.value(PARETO_X) for j in points])
    for job in points:
        x, y = (job.value(PARETO_X) or 0.0) / per, job.value(PARETO_Y) or 0.0
        xerr, yerr = _error(job, PARETO_X, x, per), _error(job, PARETO_Y, y, 1.0)
        ax.errorbar([x], [y], xerr=[[xerr[0]], [xerr[1]]], yerr=[[yerr[0]], [yerr[1]]],
                    fmt="o", color="C0", mfc="white" if job.num in bound else "C0",
                    capsize=2, alpha=0.8)  # fmt: skip

    x_rule, y_rule = _axis_of(points, PARETO_X, per), _axis_of(points, PARETO_Y)
    placed = sorted(((j.value(PARETO_X) or 0.0) / per, j.value(PARETO_Y) or 0.0, j.num)
                    for j in points)  # fmt: skip
    levels = label_levels([(px, py) for px, py, _ in placed], x_rule, y_rule)
    for (px, py, num), level in zip(placed, levels, strict=True):  # near points' labels stack
        ax.annotate(str(num), (px, py), fontsize=8, xytext=(4, 4 + 10 * level),
                    textcoords="offset points")  # fmt: skip
    front = pareto_front(points)
    ax.plot([(j.value(PARETO_X) or 0.0) / per for j in front], [j.value(PARETO_Y) for j in front],
            color="C1", alpha=0.7)  # fmt: skip
    _set_axis(ax, x_rule, "x")
    _set_axis(ax, y_rule)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.set_xlabel(f"TPOT p90 ({unit}): {x_rule.note}", fontsize=8)
    ax.set_title(f"Pareto: throughput (tok/s) vs TPOT p90; points: job numbers,\n"
                 f"hollow: arrival-bound; y {y_rule.note}", fontsize=9)  # fmt: skip
    ax.grid(True, alpha=0.3)
    return front


def _x_ticks(ax: Any, axis: XAxis) -> None:
    """Numbers on a linear or (for wide ranges) base-2 log axis; other values as categories."""
    from matplotlib.ticker import NullLocator

    if axis.numbers is None:
        ax.set_xticks(list(axis.position.values()), axis.distinct, rotation=30, ha="right")
        ax.set_xlim(-0.5, len(axis.distinct) - 0.5)
        return
    lo, hi = min(axis.numbers), max(axis.numbers)
    if axis.log:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(lo / 1.25, hi * 1.25)
    else:
        pad = (hi - lo) * 0.06 or 0.5
        ax.set_xlim(lo - pad, hi + pad)
    ticks = sorted(axis.numbers)
    ax.set_xticks(ticks, [_fmt_tick(n) for n in ticks])


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _fmt_tick(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"
