"""The page's charts, in Bokeh: every point a job whose hover shows its overrides, its
figure with its band and the `pipeline.review` command against the best, and whose click
opens its folder; bands as whiskers; every value axis by pipeline/page/axes.py's rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.page.axes import Axis, label_levels
from pipeline.page.document import Charts

WIDTH, HEIGHT = 440, 300  # pixels a panel
PARETO_WIDTH, PARETO_HEIGHT = 760, 460
LABEL_STEP = 13  # pixels between stacked labels of near points
TOOLTIPS = [
    ("job", "@job"),
    ("overrides", "@label"),
    ("figure", "@figure"),
    ("band", "@band"),
    ("review", "@review"),
    ("click", "opens the job's folder"),
]


@dataclass(frozen=True)
class Point:
    """One job on a chart: where it sits, its band's ends, and what hover and click show."""

    x: float
    y: float
    job: int
    label: str  # the job's overrides
    href: str  # its folder, relative to the page
    review: str  # the pipeline.review command against the best
    figure: str  # the figure as hover prints it, with its unit
    band: str = ""  # `low-high`, or "" where it has none
    low: float | None = None  # the y band's ends
    high: float | None = None
    x_low: float | None = None  # the x band's ends (the Pareto chart's)
    x_high: float | None = None
    hollow: bool = False  # arrival-bound: drawn open


@dataclass(frozen=True)
class Ticks:
    """The x-axis: its title, its ticks (position, label), and whether it is log (base 2)."""

    title: str
    ticks: list[tuple[float, str]]
    log: bool = False


def _source(points: Sequence[Point]) -> Any:
    from bokeh.models import ColumnDataSource

    data: dict[str, list[Any]] = {
        name: [getattr(p, name) for p in points]
        for name in ("x", "y", "job", "label", "href", "review", "figure", "band")
    }
    data["low"] = [p.y if p.low is None else p.low for p in points]
    data["high"] = [p.y if p.high is None else p.high for p in points]
    data["x_low"] = [p.x if p.x_low is None else p.x_low for p in points]
    data["x_high"] = [p.x if p.x_high is None else p.x_high for p in points]
    data["fill"] = ["white" if p.hollow else None for p in points]
    data["name"] = [str(p.job) for p in points]
    return ColumnDataSource(data)


def _figure(title: str, y: Axis, x_log: bool = False, size: tuple[int, int] = (WIDTH, HEIGHT)):
    from bokeh.models import Range1d
    from bokeh.plotting import figure

    chart = figure(
        title=f"{title}: {y.note}",
        width=size[0],
        height=size[1],
        y_axis_type="log" if y.log else "linear",
        x_axis_type="log" if x_log else "linear",
        tools="pan,box_zoom,reset,save",
        toolbar_location="right",
    )
    chart.y_range = Range1d(y.start, y.end)
    chart.title.text_font_size = "11px"
    return chart


def _points(chart: Any, points: Sequence[Point], color: str, legend: str = "") -> Any:
    """Points with their whiskers, hover and click; returns the glyph renderer."""
    from bokeh.models import HoverTool, OpenURL, TapTool, Whisker

    source = _source(points)
    chart.add_layout(Whisker(base="x", lower="low", upper="high", source=source,
                             line_color=color, line_alpha=0.8))  # fmt: skip
    extra = {"legend_label": legend} if legend else {}
    glyph = chart.scatter("x", "y", source=source, size=9, line_color=color,
                          fill_color=color, **extra)  # fmt: skip
    glyph.glyph.fill_color = {"field": "fill"} if any(p.hollow for p in points) else color
    chart.add_tools(HoverTool(renderers=[glyph], tooltips=TOOLTIPS))
    chart.add_tools(TapTool(renderers=[glyph], callback=OpenURL(url="@href")))
    return source


def line_panel(
    title: str,
    y: Axis,
    ticks: Ticks,
    series: dict[str, list[Point]],
    palette: Sequence[str],
    lines: bool = True,
) -> Any:
    """One figure against the swept key, a line a series (points alone: `lines` False)."""
    from bokeh.models import FixedTicker

    chart = _figure(title, y, ticks.log)
    for (name, points), color in zip(series.items(), palette, strict=False):
        if lines:
            chart.line([p.x for p in points], [p.y for p in points], line_color=color,
                       line_width=2)  # fmt: skip
        _points(chart, points, color, name)
    chart.xaxis.axis_label = ticks.title
    chart.xaxis.ticker = FixedTicker(ticks=[t for t, _ in ticks.ticks])
    chart.xaxis.major_label_overrides = {t: label for t, label in ticks.ticks}
    if len(series) > 1:  # below the panel, clear of the lines
        legend = chart.legend[0]
        legend.orientation, legend.click_policy = "horizontal", "hide"
        legend.label_text_font_size = "10px"
        chart.add_layout(legend, "below")
    return chart


def pareto_panel(
    title: str,
    axes: tuple[Axis, Axis],
    titles: tuple[str, str],
    groups: dict[str, list[Point]],
    front: Sequence[Point],
    palette: Sequence[str],
) -> Any:
    """The trade-off: each point labelled by its job's number (its overrides on hover and in
    the table), bands both ways, the front joined."""
    from bokeh.models import LabelSet, Range1d, Whisker

    x, y = axes
    every = sorted((p for points in groups.values() for p in points), key=lambda p: (p.x, p.y))
    levels = label_levels([(p.x, p.y) for p in every], x, y)
    lift = {p.job: 4 + LABEL_STEP * level for p, level in zip(every, levels, strict=True)}
    chart = _figure(title, y, x.log, (PARETO_WIDTH, PARETO_HEIGHT))
    chart.x_range = Range1d(x.start, x.end)
    if front:
        chart.line([p.x for p in front], [p.y for p in front], line_color="black",
                   line_width=2, line_alpha=0.6, legend_label="Pareto front")  # fmt: skip
    for (name, points), color in zip(groups.items(), palette, strict=False):
        source = _points(chart, points, color, name)
        source.data["lift"] = [lift[p.job] for p in points]
        chart.add_layout(Whisker(base="y", lower="x_low", upper="x_high", source=source,
                                 dimension="width", line_color=color, line_alpha=0.8))  # fmt: skip
        chart.add_layout(LabelSet(x="x", y="y", text="name", source=source, x_offset=6,
                                  y_offset="lift", text_font_size="11px"))  # fmt: skip
    chart.xaxis.axis_label = f"{titles[0]}: {x.note}"
    chart.yaxis.axis_label = titles[1]
    chart.legend.label_text_font_size = "10px"
    chart.legend.location = "top_right"
    return chart


def charts(pareto: Any, panels: Sequence[Any], help: str) -> Charts:
    """The charts as the page embeds them: the Pareto chart, then the panels three a row."""
    from bokeh.embed import components
    from bokeh.layouts import column, gridplot
    from bokeh.resources import Resources

    parts = [pareto] if pareto is not None else []
    if panels:
        parts.append(gridplot(list(panels), ncols=3, toolbar_location="right"))
    script, div = components(column(parts))
    library = Resources(mode="inline", components=["bokeh"])  # no widgets, no tables
    return Charts(library.render_js() + library.render_css(), div, script, help)
