"""The page's parts as values (facts, advice, tables, charts) and the page made of them:
rendered by the Jinja2 template beside this file, written through the run folder's
no-link writer."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pipeline.run_folder.run_files import write_file

TEMPLATE = "page.html.j2"


@dataclass(frozen=True)
class Cell:
    """One table cell: its text, what it sorts by, and optionally a link, a band's
    `low-high`, a hover title, or code to copy."""

    text: str
    sort: float | str | None = None
    href: str = ""
    band: str = ""
    title: str = ""
    code: bool = False

    @property
    def sort_key(self) -> str:
        """The data-sort attribute: a number as text, "" for none (sorted last)."""
        if self.sort is None or (isinstance(self.sort, float) and not math.isfinite(self.sort)):
            return ""
        return repr(self.sort) if isinstance(self.sort, (int, float)) else self.sort


@dataclass(frozen=True)
class Column:
    name: str
    text: bool = False  # sorted as text, left-aligned
    title: str = ""  # what the column means, on hover


@dataclass(frozen=True)
class Row:
    cells: list[Cell]
    anchor: str = ""  # the row's id: `job-3`
    kind: str = ""  # `best`, `out` (ruled out or failed), or ""


@dataclass(frozen=True)
class Table:
    anchor: str
    caption: str
    help: str
    columns: list[Column]
    rows: list[Row]


@dataclass(frozen=True)
class AdviceLine:
    text: str
    tie: bool = False


@dataclass(frozen=True)
class Charts:
    """Bokeh's output for the page: the inline script library, the div and the script
    that draws into it."""

    resources: str
    div: str
    script: str
    help: str = ""


@dataclass(frozen=True)
class Page:
    title: str
    facts: list[tuple[str, str]]
    lead: str
    advice: list[AdviceLine]
    notes: list[str]
    tables: list[Table]
    charts: Charts
    footer: str = ""
    extra: dict[str, str] = field(default_factory=dict)


def render(page: Page) -> str:
    import jinja2

    source = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    tables = [_table_view(t) for t in page.tables]
    return environment.from_string(source).render(
        title=page.title,
        facts=page.facts,
        lead=page.lead,
        advice=page.advice,
        notes=page.notes,
        tables=tables,
        chart_resources=page.charts.resources,
        chart_div=page.charts.div,
        chart_script=page.charts.script,
        chart_help=page.charts.help,
        footer=page.footer,
    )


def _table_view(table: Table) -> dict[str, object]:
    """The table as the template reads it: each cell's sort key as text."""
    rows = [
        {
            "anchor": row.anchor,
            "kind": row.kind,
            "cells": [{**cell.__dict__, "sort": cell.sort_key} for cell in row.cells],
        }
        for row in table.rows
    ]
    return {**table.__dict__, "rows": rows}


def write_page(page: Page, path: Path) -> Path:
    """The page, written whole by the run folder's writer: never through a link
    (RunFolderError names the path)."""
    return write_file(path, render(page))


def number_text(value: float) -> str:
    """A figure as the tables print it: three significant digits, whole numbers from 100."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def range_text(low: float, high: float) -> str:
    """A band's ends as the tables print them: `774-1,026`."""
    return f"{number_text(low)}-{number_text(high)}"


def folder_link(folder: Path, page_folder: Path) -> str:
    """A job's folder as the page links it: relative, so the page moves with its sweep."""
    return os.path.relpath(folder, page_folder) + "/"


def review_command(best: Path | None, job: Path) -> str:
    """The command that compares a job with the best (configs, figures and outputs);
    "" for the best itself, or without one."""
    if best is None or best == job:
        return ""
    return f"python -m pipeline.review {shlex.quote(str(best))} {shlex.quote(str(job))}"


def job_row(cells: list[Cell], num: int, page_folder: Path, folder: Path, review: str,
            kind: str) -> Row:  # fmt: skip
    """A job's row: its number linking to its folder first, its review command last."""
    link = Cell(str(num), num, href=folder_link(folder, page_folder))
    return Row([link, *cells, Cell(review, code=bool(review))], f"job-{num}", kind)


def hours_minutes(seconds: float | None) -> str:
    """A duration as a reader plans by it: `45 s`, `12 min`, `3 h 05 min`."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60:,} h {minutes % 60:02d} min"


def figure_cell(
    value: float | None, ends: tuple[float, float] | None = None, digits: str = ""
) -> Cell:
    """A figure and, where it has one, its band's `low-high`, both as the tables print
    numbers; it sorts by the figure."""
    if value is None:
        return Cell("", None)
    text = f"{value:{digits}}" if digits else number_text(float(value))
    band = range_text(*ends) if ends is not None and ends[0] != ends[1] else ""
    return Cell(text, float(value), band=band)


def text_cells(values: Sequence[str]) -> list[Cell]:
    return [Cell(v, v) for v in values]
