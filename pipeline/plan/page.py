"""A plan's report.html: the chosen configuration on top, the plan's own rows (ranks, ties
and bands as pipeline/plan/table.py made them, never ranked again here) in a sortable
table, and the trade-off and ranking charts, every predicted figure with its band."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    number_text,
    range_text,
    review_command,
    write_page,
)
from pipeline.plan.candidates import Candidate, Ranking, pareto_front
from pipeline.plan.table import BANDED, band_ends, shown_columns

PER_USER, PER_CARD = "tok_s_per_user", "output_tok_s_per_card"


def _href(c: Candidate, folder: Path) -> str:
    return folder_link(c.job.path, folder)


def _review(c: Candidate, chosen: Candidate | None) -> str:
    return review_command(chosen.job.path if chosen else None, c.job.path)


def _cell(key: str, value: Any, ends: Mapping[str, tuple[float, float]]) -> Cell:
    if value is None:
        return Cell("", None)
    if key in ("warmup_s", "ready_s"):
        return Cell(hours_minutes(float(value)), float(value))
    if key == "headroom":
        return Cell(f"{value:+.0%}", float(value))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return Cell(str(value), str(value))
    return figure_cell(float(value), ends.get(key) if key in BANDED else None)


def _table(
    folder: Path,
    cands: Sequence[Candidate],
    rows: Sequence[Mapping[str, Any]],
    prices: Mapping[str, float],
    chosen: Candidate | None,
) -> Table:
    shown = [k for k in shown_columns(rows) if k != "job"]  # the job's link comes first
    text = {k for k in shown if any(isinstance(r.get(k), str) for r in rows)}
    names = {"warmup_s": "warmup", "ready_s": "ready"}
    columns = [Column("job", title="the job's number: opens its folder")]
    columns += [Column(names.get(k, k), k in text, k) for k in shown]
    columns.append(Column("review against the best", True, "copy and run"))
    out = []
    for c, r in zip(cands, rows, strict=True):
        ends = band_ends(c, r, prices)
        cells = [_cell(k, r.get(k), ends) for k in shown]
        kind = "best" if c is chosen else "out" if c.ruled_out else ""
        out.append(job_row(cells, c.job.num, folder, c.job.path, _review(c, chosen), kind))
    help = (
        "The plan's rows in its order (rank); click a heading to sort. Each predicted "
        "figure shows its band (low-high): rows whose bands overlap are tied."
    )
    return Table("configurations", "Configurations", help, columns, out)


def _facts(
    folder: Path, cands: Sequence[Candidate], ranking: Ranking, prices: Mapping[str, float]
) -> list[tuple[str, str]]:
    devices = sorted({c.device for c in cands})
    bands = []
    for device in devices:
        band = next(c.band for c in cands if c.device == device)
        release = f"; figures describe {band.software}" if band.software else ""
        bands.append(f"{device}: {band.describe()}{release}")
    ruled = sum(bool(c.ruled_out) for c in cands)
    target = next((c.target for c in cands if c.target), None)
    facts = [
        ("Plan", str(folder)),
        ("Configurations", f"{len(cands)}: {len(cands) - ruled} ranked, {ruled} ruled out"),
        ("Engine", ", ".join(sorted({c.job.engine for c in cands}))),
        ("Device", ", ".join(devices)),
        ("Bands", "; ".join(bands)),
        ("Ranked by", ranking.by),
    ]
    if target:
        facts.append(("Target", f"{target['target']:g} {target['unit']}"))
    priced = [f"{d} ${prices[d]:g}/card-hour" for d in devices if prices.get(d)]
    facts.append(("Prices", ", ".join(priced) or "none given"))
    return facts


def _lead(
    chosen: Candidate | None, rows: Sequence[Mapping[str, Any]], cands: Sequence[Candidate]
) -> str:
    if chosen is None:
        if cands and all(c.job.status != "ok" for c in cands):
            return "No recommendation: every job of the plan failed (see the notes column)."
        return "No recommendation: no configuration met the SLO within the limits."
    r = rows[list(cands).index(chosen)]
    parts = [f"Best: job {chosen.job.num} on {chosen.device}", str(r.get("config") or "")]
    if r.get("cards") is not None:
        parts.append(f"{r['cards']} card{'' if r['cards'] == 1 else 's'}")
    if r.get("usd_per_hour") is not None:
        parts.append(f"${number_text(float(r['usd_per_hour']))}/hour")
    for key, words in (("ready_s", "ready in"), ("warmup_s", "warmup")):
        if r.get(key) is not None:
            parts.append(f"{words} {hours_minutes(float(r[key]))}")
    return ", ".join(p for p in parts if p)


def _advice(ranking: Ranking, chosen: Candidate | None) -> list[AdviceLine]:
    lines = []
    if ranking.note:
        lines.append(AdviceLine(ranking.note, len(ranking.tied) > 1))
    if chosen is not None:
        lines.append(AdviceLine(f"deploy it: python -m pipeline.deploy {chosen.job.path}"))
    return lines


def _point(c: Candidate, r: Mapping[str, Any], ends: Mapping, folder: Path, x: float,
           y_key: str, chosen: Candidate | None) -> Point:  # fmt: skip
    """A row as a chart point: y is `y_key`'s figure, x its place."""
    y = float(r[y_key])
    low, high = ends.get(y_key, (None, None))
    band = "" if low is None else range_text(low, high)
    return Point(x, y, c.job.num, f"{c.device} {r.get('config') or ''}".strip(),
                 _href(c, folder), _review(c, chosen), f"{y_key} {number_text(y)}", band,
                 low, high)  # fmt: skip


def _by_device(points: Sequence[tuple[Candidate, Point]]) -> dict[str, list[Point]]:
    groups: dict[str, list[Point]] = {}
    for c, p in points:
        groups.setdefault(c.device, []).append(p)
    return groups


def _axis(points: Sequence[Point], x: bool = False):
    if x:
        return value_axis([p.x for p in points], [p.x_low for p in points if p.x_low],
                          [p.x_high for p in points if p.x_high])  # fmt: skip
    return value_axis([p.y for p in points], [p.low for p in points if p.low is not None],
                      [p.high for p in points if p.high is not None])  # fmt: skip


def _pareto(folder: Path, cands: Sequence[Candidate], rows: Sequence[Mapping[str, Any]],
            ends: Sequence[Mapping], chosen: Candidate | None):  # fmt: skip
    """Tokens/s per card against tokens/s per user, a colour a device, bands both ways."""
    placed = []
    for c, r, e in zip(cands, rows, ends, strict=True):
        if c.ruled_out or r.get(PER_USER) is None or r.get(PER_CARD) is None:
            continue
        p = _point(c, r, e, folder, float(r[PER_USER]), PER_CARD, chosen)
        x_low, x_high = e.get(PER_USER, (None, None))
        placed.append((c, Point(**{**p.__dict__, "x_low": x_low, "x_high": x_high})))
    if not placed:
        return None
    every = [p for _, p in placed]
    on_front = {c.job.num for c in pareto_front(cands)}
    front = sorted((p for p in every if p.job in on_front), key=lambda p: p.x)
    from bokeh.palettes import Category10_10

    title = "Each configuration at its capacity: tokens/s per card against per user"
    titles = ("output tokens/s per user", "output tokens/s per card")
    axes = (_axis(every, x=True), _axis(every))
    return pareto_panel(title, axes, titles, _by_device(placed), front, list(Category10_10))


def _ranking(folder: Path, cands: Sequence[Candidate], rows: Sequence[Mapping[str, Any]],
             ends: Sequence[Mapping], by: str, chosen: Candidate | None):  # fmt: skip
    """The ranking figure of each ranked row, in the plan's order, with its band."""
    placed = []
    for at, (c, r, e) in enumerate(zip(cands, rows, ends, strict=True)):
        if not c.ruled_out and isinstance(r.get(by), (int, float)):
            placed.append((c, _point(c, r, e, folder, float(at), by, chosen)))
    if not placed:
        return None
    from bokeh.palettes import Category10_10

    ticks = Ticks("job, in the plan's order", [(p.x, f"job {p.job}") for _, p in placed])
    y = _axis([p for _, p in placed])
    return line_panel(f"{by} by configuration", y, ticks, _by_device(placed),
                      list(Category10_10), lines=False)  # fmt: skip


def plan_page(folder: Path, cands: Sequence[Candidate], rows: Sequence[Mapping[str, Any]],
              prices: Mapping[str, float], ranking: Ranking) -> Page:  # fmt: skip
    """`cands` and `rows` in the plan's table order (pipeline/plan/report.py)."""
    chosen = ranking.order[0] if ranking.order else None
    ends = [band_ends(c, r, prices) for c, r in zip(cands, rows, strict=True)]
    ranked = _ranking(folder, cands, rows, ends, ranking.by, chosen)
    help = (
        "Hover a point for its configuration, figure, band and review command; click it to "
        "open the job's folder. Whiskers are bands. Every value axis starts at 0, or is "
        "logarithmic where the figures span over 100x (said in the title)."
    )
    drawn = charts(_pareto(folder, cands, rows, ends, chosen), [ranked] if ranked else [], help)
    return Page(f"Plan {folder}", _facts(folder, cands, ranking, prices),
                _lead(chosen, rows, cands), _advice(ranking, chosen), [],
                [_table(folder, cands, rows, prices, chosen)], drawn,
                "Written by python -m pipeline.plan")  # fmt: skip


def write_plan_page(folder: Path, cands: Sequence[Candidate], rows: Sequence[Mapping[str, Any]],
                    prices: Mapping[str, float], ranking: Ranking) -> Path:  # fmt: skip
    """report.html in the plan folder; returns its path."""
    return write_page(plan_page(folder, cands, rows, prices, ranking), folder / REPORT_HTML)
