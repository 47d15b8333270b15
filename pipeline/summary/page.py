"""A sweep's report.html: the recommendation, the facts a reader needs (engine, device,
bands, warmup), every job in a sortable table with its band, and its charts."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from pipeline.page import REPORT_HTML
from pipeline.page.axes import value_axis
from pipeline.page.charts import Point, Ticks, charts, line_panel, pareto_panel
from pipeline.page.document import (
    AdviceLine,
    Cell,
    Column,
    Page,
    Table,
    figure_cell,
    folder_link,
    hours_minutes,
    job_row,
    range_text,
    review_command,
    write_page,
)
from pipeline.run_folder.reader import RunStatus
from pipeline.summary.advice import Advice, advise, overall
from pipeline.summary.jobs import (
    Job,
    bands_said,
    device_label,
    engines,
    split_override,
)
from pipeline.summary.panels import (
    PARETO_X,
    PARETO_Y,
    job_label,
    pareto_front,
    pareto_points,
    series,
    shown_panels,
    unit_of,
    x_axis,
)

# (column, heading): the table's figures, in the summary's order
FIGURES = [
    ("output_throughput", "throughput tok/s"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "TTFT p90 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("tpot_p50_ms", "TPOT p50 ms"),
    ("tpot_p90_ms", "TPOT p90 ms"),
    ("itl_p99_ms", "ITL p99 ms"),
    ("e2e_p50_ms", "E2E p50 ms"),
    ("token_utilization", "utilization"),
    ("num_preemptions", "preemptions"),
    ("serving_compiles", "compiles serving"),
    ("warmup_shapes", "warmup graphs"),
]
SLO_FIGURES = [("request_goodput", "goodput req/s"), ("slo_attainment", "SLO attainment")]


def _palette() -> list[str]:
    from bokeh.palettes import Category10_10

    return list(Category10_10)


def _href(job: Job, folder: Path) -> str:
    return folder_link(job.path, folder)


def _review(job: Job, best: Job | None) -> str:
    return review_command(best.path if best else None, job.path)


def _facts(folder: Path, jobs: Sequence[Job], keys: Sequence[str]) -> list[tuple[str, str]]:
    ok = sum(j.status == RunStatus.OK for j in jobs)
    common = [o for o in jobs[0].overrides if split_override(o)[0] not in keys]
    devices = sorted({device_label(j.metrics) for j in jobs} - {""})
    warmups = [j.value("predicted_warmup_s") for j in jobs]
    shown = [w for w in warmups if w is not None]
    facts = [
        ("Sweep", str(folder)),
        ("Jobs", f"{len(jobs)}: {ok} ok, {len(jobs) - ok} not ok"),
        ("Swept", ", ".join(keys) or "nothing (every job has the same overrides)"),
        ("Every job", " ".join(common) or "-"),
        ("Engine", ", ".join(engines(jobs))),
        ("Device", ", ".join(devices) or "measured on this machine (not simulated)"),
        ("Bands", "; ".join(bands_said(jobs)) or "none: measured figures"),
    ]
    if shown:
        span = sorted({hours_minutes(min(shown)), hours_minutes(max(shown))})
        facts.append(("Warmup", " to ".join(span) + " predicted (graph compiles before serving)"))
    return facts


def _advice(advice: Sequence[Advice], keys: Sequence[str]) -> tuple[str, list[AdviceLine]]:
    lines = [AdviceLine(a.text.removeprefix("- "), len(a.tied) > 1) for a in advice]
    lead = overall(advice)
    if lead is None:
        return "No recommendation: fewer than two jobs finished, or nothing was swept.", lines
    tie = " (a tie: see below)" if len(lead.tied) > 1 else ""
    words = {"output_throughput": "throughput", "request_goodput": "goodput"}
    by = words.get(lead.column, lead.column)
    return f"Best by {by}: job {lead.job.num}, {job_label(lead.job, keys)}{tie}", lines


def _table(
    folder: Path, jobs: Sequence[Job], keys: Sequence[str], best: Job | None, slo: bool
) -> Table:
    figures = [*FIGURES, *(SLO_FIGURES if slo else [])]
    columns = [
        Column("job", title="the job's number: opens its folder"),
        Column("overrides", True, "the job's values of the swept keys"),
        Column("status", True),
        *(Column(heading, title=f"{name}; (low-high): the band") for name, heading in figures),
        Column("warmup", title="predicted warmup (predicted_warmup_s)"),
        Column("error", True),
        Column("review against the best", True, "copy and run to compare configs and outputs"),
    ]
    rows = []
    for job in jobs:
        cells = [
            Cell(" ".join(o for o in job.overrides if split_override(o)[0] in keys) or "-"),
            Cell(job.status, job.status),
            *(figure_cell(job.value(name), job.ends(name)) for name, _ in figures),
            Cell(hours_minutes(job.value("predicted_warmup_s")), job.value("predicted_warmup_s")),
            Cell(job.error, job.error),
        ]
        kind = "best" if job is best else "" if job.status == RunStatus.OK else "out"
        rows.append(job_row(cells, job.num, folder, job.path, _review(job, best), kind))
    help = (
        "Click a heading to sort. A simulated figure shows its band (low-high); "
        "figures whose bands overlap cannot be told apart."
    )
    return Table("jobs", "Jobs", help, columns, rows)


def _points(
    folder: Path, jobs: Sequence[Job], column: str, per: float, best: Job | None,
    bound: AbstractSet[int], x: dict[int, float],
) -> list[Point]:  # fmt: skip
    """The jobs with a figure in `column`, in the unit `per` converts to, at x[job.num]."""
    unit, _ = unit_of(column, [j.value(column) for j in jobs])
    found = []
    for job in jobs:
        value, ends = job.value(column), job.ends(column)
        if value is None or job.num not in x:
            continue
        low, high = (None, None) if ends is None else (ends[0] / per, ends[1] / per)
        text = f"{value / per:,.4g} {unit}".strip()
        found.append(Point(
            x[job.num], value / per, job.num, " ".join(job.overrides), _href(job, folder),
            _review(job, best), text, "" if ends is None else range_text(low, high),
            low, high, hollow=job.num in bound,
        ))  # fmt: skip
    return found


def _panels(folder: Path, jobs: Sequence[Job], keys: Sequence[str], slo: bool,
            best: Job | None, bound: AbstractSet[int]) -> list:  # fmt: skip
    axis = x_axis(jobs, keys)
    ticks = Ticks(axis.key or "job", axis.ticks(), axis.log)
    lines = series(jobs, keys, axis)
    panels = []
    for column, title in shown_panels(jobs, slo):
        unit, per = unit_of(column, [j.value(column) for j in jobs])
        by_series = {}
        for name, members in lines.items():
            x = {job.num: at for at, job in members}
            by_series[name] = _points(folder, [j for _, j in members], column, per, best, bound, x)
        every = [p for points in by_series.values() for p in points]
        y = value_axis([p.y for p in every], [p.low for p in every if p.low is not None],
                       [p.high for p in every if p.high is not None])  # fmt: skip
        heading = f"{title} ({unit})" if unit else title
        panels.append(line_panel(heading, y, ticks, by_series, _palette()))
    return panels


def _pareto(folder: Path, jobs: Sequence[Job], best: Job | None, bound: AbstractSet[int]):
    """Throughput against TPOT p90, a colour a device."""
    shown = pareto_points(jobs)
    if not shown:
        return None
    unit, per = unit_of(PARETO_X, [j.value(PARETO_X) for j in shown])
    x_of = {j.num: (j.value(PARETO_X) or 0.0) / per for j in shown}
    points = {p.job: p for p in _points(folder, shown, PARETO_Y, 1.0, best, bound, x_of)}
    for job in shown:  # the x band: TPOT p90's
        ends = job.ends(PARETO_X)
        if ends is not None:
            old = points[job.num]
            points[job.num] = Point(**{**old.__dict__, "x_low": ends[0] / per,
                                       "x_high": ends[1] / per})  # fmt: skip
    groups: dict[str, list[Point]] = {}
    for job in shown:
        groups.setdefault(device_label(job.metrics) or "measured", []).append(points[job.num])
    front = [points[j.num] for j in pareto_front(shown)]
    every = list(points.values())
    x = value_axis([p.x for p in every], [p.x_low for p in every if p.x_low is not None],
                   [p.x_high for p in every if p.x_high is not None])  # fmt: skip
    y = value_axis([p.y for p in every], [p.low for p in every if p.low is not None],
                   [p.high for p in every if p.high is not None])  # fmt: skip
    title = "Pareto: output throughput (tok/s) against TPOT p90; points are job numbers"
    return pareto_panel(title, (x, y), (f"TPOT p90 ({unit})", "output throughput (tok/s)"),
                        groups, front, _palette())  # fmt: skip


def sweep_page(
    folder: Path, jobs: Sequence[Job], keys: Sequence[str], slo: bool, notes: Sequence[str],
    bound: AbstractSet[int],
) -> Page:  # fmt: skip
    advice = advise(jobs, keys, slo)
    lead_advice = overall(advice)
    best = next((j for j in jobs if lead_advice and j.num == lead_advice.job.num), None)
    lead, lines = _advice(advice, keys)
    help = (
        "Hover a point for its job's overrides, figure, band and review command; click it to "
        "open the job's folder. Whiskers are bands; hollow points are arrival-bound. Every "
        "value axis starts at 0, or is logarithmic where the figures span over 100x (said "
        "in the title), and each title gives the figures' spread."
    )
    pareto = _pareto(folder, jobs, best, bound)
    drawn = charts(pareto, _panels(folder, jobs, keys, slo, best, bound), help)
    table = _table(folder, jobs, keys, best, slo)
    return Page(f"Sweep {folder}", _facts(folder, jobs, keys), lead, lines, list(notes),
                [table], drawn, "Written by python -m pipeline.summary")  # fmt: skip


def write_sweep_page(
    folder: Path, jobs: Sequence[Job], keys: Sequence[str], slo: bool, notes: Sequence[str],
    bound: AbstractSet[int],
) -> Path:  # fmt: skip
    """report.html in the sweep folder; returns its path."""
    page = sweep_page(folder, jobs, keys, slo, notes, bound)
    return write_page(page, folder / REPORT_HTML)
