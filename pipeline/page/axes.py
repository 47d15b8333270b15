"""The one rule every panel's value axis follows, in summary.png and report.html alike.

A linear axis starts at 0, so a bar's or a point's height is its figure and a 6% spread
looks like 6%, not a cliff. Where the positive figures span more than LOG_SPAN (warmup from
seconds to days) a linear axis would flatten all but the largest: the axis is then
logarithmic, which is the marked break, and the panel says so. Either way the panel writes
the figures' spread, and the axis reaches the ends of their bands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.page.document import number_text

LOG_SPAN = 100.0  # figures whose positive values span more than this get a log axis
HEADROOM = 1.08  # the axis ends this far above the highest figure or band end
NEAR = 0.05  # points this close (a share of each axis) would print their labels over each other


@dataclass(frozen=True)
class Axis:
    """Where a value axis starts and ends, whether it is logarithmic, and what the panel
    writes about it."""

    log: bool
    start: float
    end: float
    note: str


def spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / max of the values, None without two positive values."""
    shown = [v for v in values if v is not None]
    if len(shown) < 2 or max(shown) <= 0:
        return None
    return (max(shown) - min(shown)) / max(shown)


def log_scale(values: Sequence[float | None]) -> bool:
    positive = [v for v in values if v is not None and v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SPAN


def value_axis(
    values: Sequence[float | None], lows: Sequence[float] = (), highs: Sequence[float] = ()
) -> Axis:
    """The axis of a panel's figures (`lows`, `highs`: their bands' ends, where banded)."""
    shown = [float(v) for v in values if v is not None]
    if not shown:
        return Axis(False, 0.0, 1.0, "no figures")
    text = _spread_text(shown)
    top = max([*shown, *highs])
    if log_scale(shown):
        bottom = min(v for v in [*shown, *lows] if v > 0)
        span = max(shown) / min(v for v in shown if v > 0)
        return Axis(True, bottom / 1.5, top * 1.5, f"log axis (figures span {span:,.0f}x); {text}")
    bottom = min([0.0, *shown, *lows])
    return Axis(False, bottom, (top or 1.0) * HEADROOM, f"from 0; {text}")


def _spread_text(shown: Sequence[float]) -> str:
    low, high = min(shown), max(shown)
    if len(shown) < 2 or low == high:
        return f"all {number_text(high)}"
    share = spread(shown)
    ratio = f" {share:.1%}" if share is not None else ""
    return f"spread{ratio} ({number_text(low)}-{number_text(high)})"


def _place(value: float, axis: Axis) -> float:
    """Where a value sits along its axis, 0 at the start and 1 at the end."""
    if axis.log:
        low, high, value = (
            math.log10(axis.start),
            math.log10(axis.end),
            math.log10(max(value, 1e-12)),
        )
    else:
        low, high = axis.start, axis.end
    return (value - low) / ((high - low) or 1.0)


def label_levels(points: Sequence[tuple[float, float]], x: Axis, y: Axis) -> list[int]:
    """How many label heights each point's label is raised so near points' labels stack
    instead of overlapping: one more for each earlier point within NEAR of it on both axes."""
    placed = [(_place(px, x), _place(py, y)) for px, py in points]
    return [
        sum(abs(a - c) < NEAR and abs(b - d) < NEAR for c, d in placed[:i])
        for i, (a, b) in enumerate(placed)
    ]
