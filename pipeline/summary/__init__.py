"""The sweep summary: one row per job and a plot, built from the job folders on disk.

Reading the folders (rather than the launcher's return values) is what makes it work with
any launcher, joblib's worker processes and a SLURM array included, and for sweeps that
were run somewhere else: `python -m pipeline.summary SWEEP_DIR`.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from pipeline.command import ArgparseCommand, Failure
from pipeline.job.console import raise_advice
from pipeline.job.signals import stop_on_signals
from pipeline.page import REPORT_HTML
from pipeline.page.document import range_text
from pipeline.run_folder.reader import RunStatus
from pipeline.run_folder.run_files import RunFolderError, write_file
from pipeline.summary.advice import arrival_bound, caveats, engines_line, recommend, slo_was_set
from pipeline.summary.jobs import (  # noqa: F401  (the sweep's readers, named here as before)
    HEADLINE,
    Job,
    bands_said,
    device_label,
    engines,
    find_jobs,
    made_by_plan,
    read_job,
    split_override,
    swept_keys,
)
from pipeline.summary.page import write_sweep_page
from pipeline.summary.panels import x_key
from pipeline.summary.plot import write_plot

# Plain stdlib logging: after the jobs, Hydra's own logging (not the jobs' structlog) is live.
log = logging.getLogger(__name__)

COLUMNS = ["job", "overrides", "status", "device", *(name for name, _ in HEADLINE), "error"]


class SummaryError(Exception):
    """A sweep folder the summary cannot be built from; the message says why."""


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)


def _row(job: Job) -> dict[str, Any]:
    row: dict[str, Any] = {"job": job.num, "overrides": " ".join(job.overrides)}
    row["status"] = job.status
    row["device"] = device_label(job.metrics)
    row.update({name: job.value(name) for name, _ in HEADLINE})
    row["error"] = job.error
    return row


def columns(jobs: Sequence[Job]) -> list[str]:
    """The columns shown: the SLO's only where some job had an SLO bound."""
    slo = any(slo_was_set(j.metrics) for j in jobs)
    return [c for c in COLUMNS if slo or c not in ("request_goodput", "slo_attainment")]


def write_csv(jobs: Sequence[Job], path: Path) -> None:
    """One row a job; a banded figure of a simulated sweep gets `_lo` / `_hi` columns."""
    text = io.StringIO(newline="")
    shown = columns(jobs)
    banded = {c for c in shown for j in jobs if j.ends(c) is not None}
    fields = [f for c in shown for f in ((c, f"{c}_lo", f"{c}_hi") if c in banded else (c,))]
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    for job in jobs:
        row = _row(job)
        for c in banded:
            row[f"{c}_lo"], row[f"{c}_hi"] = job.ends(c) or (None, None)
        writer.writerow({k: "" if row[k] is None else row[k] for k in fields})
    write_file(path, text.getvalue())


def _cell(job: Job, column: str, value: Any) -> str:
    """A markdown cell: a simulated figure with its band, `1,000 (909-1,100)`."""
    ends = job.ends(column)
    text = _fmt(value) if ends is None else f"{_fmt(value)} ({range_text(*ends)})"
    return text.replace("|", "\\|")  # a pipe inside a cell would split the table


def write_markdown(jobs: Sequence[Job], keys: Sequence[str], path: Path) -> None:
    ok = sum(j.status == RunStatus.OK for j in jobs)
    swept = ", ".join(f"`{k}`" for k in keys) or "nothing (every job has the same overrides)"
    lines = [
        f"# Sweep summary: {path.parent}",
        "",
        f"{len(jobs)} jobs, {ok} ok, {len(jobs) - ok} not ok. Swept: {swept}.",
        "",
        engines_line(jobs),
        "",
    ]
    # Overrides every job shares are said once; each row shows what sets the job apart.
    common = [o for o in jobs[0].overrides if split_override(o)[0] not in keys]
    if common:
        lines += ["Every job: " + " ".join(f"`{o}`" for o in common), ""]
    header = [c for c in columns(jobs) if c != "error"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("| " + " | ".join("---" for _ in header) + " |")
    for job in jobs:
        row = _row(job)
        row["overrides"] = " ".join(f"`{o}`" for o in _own(job, keys))
        cells = [_cell(job, c, row[c]) for c in header]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _compile_notes(jobs)
    lines += _workload_notes(jobs)
    failed = [j for j in jobs if j.status != RunStatus.OK]
    if failed:
        lines += ["", "## Jobs that did not finish", ""]
        lines += [f"- job {j.num} ({j.status}): {j.error or 'no error recorded'}" for j in failed]
    lines += ["", "![headline metrics against the swept key](summary.png)", ""]
    lines += [f"Note: {c}" for c in caveats(jobs, keys)]
    advice = recommend(jobs, keys, any(slo_was_set(j.metrics) for j in jobs))
    if advice:
        lines += ["", "## Recommendation", "", *advice]
    lines.append("")
    write_file(path, "\n".join(lines))


def _compile_notes(jobs: Sequence[Job]) -> list[str]:
    """Jobs whose simulated device compiled graphs while serving: their latencies include
    compile time a warmed deployment would not pay."""
    compiling = [j for j in jobs if j.value("serving_compiles")]
    if not compiling:
        return []
    lines = ["", "## Jobs that compiled while serving", ""]
    for j in compiling:
        seconds = j.value("serving_compile_s") or 0.0
        lines.append(
            f"- job {j.num}: {j.value('serving_compiles'):.0f} graphs compiled while serving, "
            f"{seconds:,.1f} s predicted ("
            + (
                "the warmed set leaves them out"
                if j.metrics.get("warmup_s")
                else "warmup=true compiles them before serving"
            )
            + ")"  # fmt: skip
        )
    return lines


def _workload_notes(jobs: Sequence[Job]) -> list[str]:
    """Jobs whose trace prompts were clipped to max_model_len or rejected: every
    prediction of theirs is for shorter prompts than the trace's, or fewer requests."""
    cut = [j for j in jobs if j.value("clipped") or j.value("rejected")]
    if not cut:
        return []
    lines = ["", "## Jobs whose prompts were clipped or rejected", ""]
    for j in cut:
        lines.append(
            f"- job {j.num}: {j.value('clipped') or 0:.0f} prompts clipped to max_model_len - 1, "
            f"{j.value('rejected') or 0:.0f} rejected: to serve them whole, "
            f"{raise_advice(j.metrics.get('max_position_embeddings'))}"
        )
    return lines


def _notes(jobs: Sequence[Job], keys: Sequence[str]) -> list[str]:
    """The plot's last panel: the jobs, the x-axis, and what has no point."""
    failed = [j for j in jobs if j.status != RunStatus.OK]
    text = [f"{len(jobs)} jobs, {len(jobs) - len(failed)} ok", f"x: {x_key(jobs, keys) or 'job'}"]
    text.append(f"engine: {', '.join(engines(jobs))}")
    if any(j.metrics.get("simulated") for j in jobs):
        text += ["simulated: predicted figures, bands:", *(f" {b}" for b in bands_said(jobs))]
    if failed:
        text += ["", "no point for:"]
        text += [f"job {j.num} ({j.status}) {' '.join(_own(j, keys))}" for j in failed]
    return text


def _own(job: Job, keys: Sequence[str]) -> list[str]:
    """The job's overrides of the swept keys: what sets it apart from the other jobs."""
    return [o for o in job.overrides if split_override(o)[0] in keys]


def build_summary(sweep_dir: Path) -> Path:
    """Writes summary.csv, summary.md, summary.png and report.html in the sweep folder;
    returns summary.md."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SummaryError(f"{sweep_dir}: not a folder")
    jobs = find_jobs(sweep_dir)
    if not jobs:
        raise SummaryError(f"{sweep_dir}: no job folders (none holds .hydra/overrides.yaml)")
    keys = swept_keys(jobs)
    slo = any(slo_was_set(j.metrics) for j in jobs)
    path = sweep_dir / "summary.csv"
    try:
        write_csv(jobs, path)
        path = sweep_dir / "summary.md"
        write_markdown(jobs, keys, path)
        path = sweep_dir / "summary.png"
        write_plot(jobs, keys, path, _notes(jobs, keys), slo, arrival_bound(jobs))
        path = sweep_dir / REPORT_HTML
        if not made_by_plan(jobs):  # a plan's page is its own
            write_sweep_page(sweep_dir, jobs, keys, slo, caveats(jobs, keys), arrival_bound(jobs))
    except RunFolderError as err:  # a read-only sweep folder, a full disk, a link
        raise SummaryError(
            f"{err}: make {sweep_dir} writable, or copy the sweep folder somewhere writable "
            "and summarise the copy"
        ) from err
    return sweep_dir / "summary.md"


class SweepSummaryCallback(Callback):
    """Builds the summary once every job of a multirun has finished, whatever the launcher,
    and when a stop signal ends the sweep early, of the jobs that finished.

    In the sweep's own process a SIGINT or SIGTERM raises RunInterrupted, on which a pool
    launcher (joblib) stops its workers before it lets the exception through; the summary is
    then written on the way out, once nothing is running."""

    def __init__(self) -> None:
        self._sweep_dir: Path | None = None
        self._signals: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """What a pool launcher's worker gets: the signals and the exit belong here."""
        return {"_sweep_dir": None, "_signals": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = Path(config.hydra.sweep.dir)
        self._signals = stop_on_signals()
        self._signals.__enter__()
        atexit.register(self._summarise_unfinished)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._signals is not None:
            self._signals.__exit__(None, None, None)
            self._signals = None
        self._sweep_dir = None  # summarised here, not again at exit
        summarise(Path(config.hydra.sweep.dir))

    def _summarise_unfinished(self) -> None:
        # no job folder: the sweep stopped before its first job (a refused plan), and
        # has nothing to summarise
        folder = self._sweep_dir
        if folder is not None and any(folder.glob("*/**/.hydra/overrides.yaml")):
            summarise(folder)


def summarise(sweep_dir: Path) -> None:
    try:
        path = build_summary(sweep_dir)
    except Exception as err:  # the jobs' own results are on disk; do not hide them
        log.error(
            "Sweep summary failed (%s: %s); build it with: python -m pipeline.summary %s",
            type(err).__name__,
            err,
            sweep_dir,
        )
        return
    log.info("Sweep summary: %s, summary.csv and summary.png beside it", path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.summary",
        description="Build summary.csv, summary.md and summary.png for a multirun folder "
        "(the multirun builds them itself; this rebuilds them, e.g. for a sweep run elsewhere).",
        epilog="example: python -m pipeline.summary multirun/2026-01-01/12-00-00",
    )
    parser.add_argument("sweep_dir", type=Path, help="the multirun's folder (hydra.sweep.dir)")
    return parser


def summary_command(args: argparse.Namespace, argv: list[str]) -> int:
    path = build_summary(args.sweep_dir)
    print(path.read_text(encoding="utf-8"))
    return 0


COMMAND = ArgparseCommand(
    name="pipeline.summary",
    parser=build_parser,
    run=summary_command,
    failures=(Failure((SummaryError,), 2),),
)


def main(argv: Sequence[str] | None = None) -> int:
    return COMMAND.main(argv)
