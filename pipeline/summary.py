"""The sweep summary: one row per job and a plot, built from the job folders on disk.

Reading the folders (rather than the launcher's return values) is what makes it work with
any launcher, joblib's worker processes and a SLURM array included, and for sweeps that
were run somewhere else: `python -m pipeline.summary SWEEP_DIR`.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

# Plain stdlib logging: after the jobs, Hydra's own logging (not the jobs' structlog) is live.
log = logging.getLogger(__name__)

# (column, path into metrics.json): the figures a user tunes a deployment by.
HEADLINE: list[tuple[str, tuple[str, ...]]] = [
    ("output_throughput", ("output_throughput",)),
    ("ttft_p50_ms", ("ttft_ms", "p50")),
    ("ttft_p99_ms", ("ttft_ms", "p99")),
    ("itl_p99_ms", ("itl_ms", "p99")),
    ("tpot_mean_ms", ("tpot_ms", "mean")),
    ("e2e_p50_ms", ("e2e_ms", "p50")),
    ("token_utilization", ("token_utilization",)),
    ("num_preemptions", ("num_preemptions",)),
    ("bucket_misses", ("bucket_misses",)),
    ("prefix_cache_hit_rate", ("prefix_cache_hit_rate",)),
    ("predicted_warmup_s", ("predicted_warmup_s",)),  # simulated runs only
    ("serving_compiles", ("serving_compiles",)),  # simulated: graphs compiled while serving
    ("serving_compile_s", ("serving_compile_s",)),
    ("request_goodput", ("request_goodput",)),  # requests/s that met every SLO bound
    ("slo_attainment", ("slo_attainment",)),
]
COLUMNS = ["job", "overrides", "status", *(name for name, _ in HEADLINE), "error"]

# (column, panel title) for summary.png, one panel each.
PANELS = [
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("itl_p99_ms", "ITL p99 (ms)"),
    ("output_throughput", "Output throughput (tok/s)"),
    ("token_utilization", "Token utilization (real / padded)"),
    ("prefix_cache_hit_rate", "Prefix cache hit rate"),
    ("predicted_warmup_s", "Warmup, predicted (s)"),
]
# Shown when some job had an SLO bound set.
SLO_PANELS = [
    ("request_goodput", "Goodput (req/s within SLO)"),
    ("slo_attainment", "SLO attainment"),
]


class SummaryError(Exception):
    """A sweep folder the summary cannot be built from; the message says why."""


@dataclass
class Job:
    """One job folder of a sweep, as far as the summary needs it."""

    num: int
    path: Path
    overrides: list[str]
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def override_values(self) -> dict[str, str]:
        return dict(split_override(o) for o in self.overrides)

    def value(self, column: str) -> float | None:
        for name, keys in HEADLINE:
            if name == column:
                node: Any = self.metrics
                for key in keys:
                    node = node.get(key) if isinstance(node, dict) else None
                return node if isinstance(node, (int, float)) else None
        raise KeyError(column)


def split_override(override: str) -> tuple[str, str]:
    """`max_tokens=512` -> (`max_tokens`, `512`); a bare `~key` deletion keeps an empty value."""
    key, _, value = override.partition("=")
    return key, value


def _job_number(job_dir: Path, fallback: int) -> int:
    # Hydra records the job's number in hydra.yaml; the folder name is only the default subdir.
    try:
        hydra_cfg = yaml.safe_load((job_dir / ".hydra" / "hydra.yaml").read_text())
        return int(hydra_cfg["hydra"]["job"]["num"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return int(job_dir.name) if job_dir.name.isdigit() else fallback


def read_job(job_dir: Path, fallback_num: int = 0) -> Job:
    """A job's overrides and metrics; a job that never wrote metrics.json is `interrupted`."""
    given = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
    overrides = [str(o) for o in given]
    num = _job_number(job_dir, fallback_num)
    metrics_path = job_dir / "metrics.json"
    if not metrics_path.is_file():  # killed before it could write one (SIGKILL, power loss)
        return Job(num, job_dir, overrides, "interrupted", error="no metrics.json")
    try:
        metrics = json.loads(metrics_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return Job(num, job_dir, overrides, "missing", error=f"metrics.json unreadable: {err}")
    status = str(metrics.get("status", "missing"))
    error = " ".join(str(metrics.get("error") or "").split())  # one line per job in the tables
    return Job(num, job_dir, overrides, status, metrics, error)


def find_jobs(sweep_dir: Path) -> list[Job]:
    """Every job folder under the sweep folder (a job folder holds .hydra/overrides.yaml)."""
    found = sorted(p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml"))
    found = [p for p in found if p != sweep_dir]  # a single run's folder is not a sweep
    jobs = [read_job(path, i) for i, path in enumerate(found)]
    return sorted(jobs, key=lambda j: (j.num, str(j.path)))


def swept_keys(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose value differs between jobs, in the order they were given."""
    keys: list[str] = []
    for job in jobs:
        keys += [k for k in job.override_values if k not in keys]
    return [k for k in keys if len({j.override_values.get(k, "") for j in jobs}) > 1]


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)


def _row(job: Job) -> dict[str, Any]:
    row: dict[str, Any] = {"job": job.num, "overrides": " ".join(job.overrides)}
    row["status"] = job.status
    row.update({name: job.value(name) for name, _ in HEADLINE})
    row["error"] = job.error
    return row


def write_csv(jobs: Sequence[Job], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for job in jobs:
            writer.writerow({k: "" if v is None else v for k, v in _row(job).items()})


def write_markdown(jobs: Sequence[Job], keys: Sequence[str], path: Path) -> None:
    ok = sum(j.status == "ok" for j in jobs)
    swept = ", ".join(f"`{k}`" for k in keys) or "nothing (every job has the same overrides)"
    lines = [
        f"# Sweep summary: {path.parent}",
        "",
        f"{len(jobs)} jobs, {ok} ok, {len(jobs) - ok} not ok. Swept: {swept}.",
        "",
    ]
    # Overrides every job shares are said once; each row shows what sets the job apart.
    common = [o for o in jobs[0].overrides if split_override(o)[0] not in keys]
    if common:
        lines += ["Every job: " + " ".join(f"`{o}`" for o in common), ""]
    header = [c for c in COLUMNS if c != "error"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("| " + " | ".join("---" for _ in header) + " |")
    for job in jobs:
        row = _row(job)
        row["overrides"] = " ".join(f"`{o}`" for o in _own(job, keys))
        # A pipe inside a cell would split the markdown table.
        cells = [_fmt(row[c]).replace("|", "\\|") for c in header]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _compile_notes(jobs)
    failed = [j for j in jobs if j.status != "ok"]
    if failed:
        lines += ["", "## Jobs that did not finish", ""]
        lines += [f"- job {j.num} ({j.status}): {j.error or 'no error recorded'}" for j in failed]
    lines += ["", "![headline metrics against the swept key](summary.png)", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


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
            f"{seconds:,.1f} s predicted (warmup=true compiles them before serving)"
        )
    return lines


def _has_slo(jobs: Sequence[Job]) -> bool:
    return any(len(j.metrics.get("slo") or {}) > 1 for j in jobs)  # a bound beside the target


def _as_numbers(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def write_plot(jobs: Sequence[Job], keys: Sequence[str], path: Path) -> None:
    """The headline metrics against the first swept key; other swept keys become series."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    x_key = keys[0] if keys else "job"
    labels = [j.override_values.get(x_key, "") if keys else str(j.num) for j in jobs]
    distinct = list(dict.fromkeys(labels))
    numbers = _as_numbers(distinct)
    if numbers is not None:
        position = dict(zip(distinct, numbers, strict=True))
    else:  # categorical: one slot per value, in the order the sweep gave them
        position = {label: float(i) for i, label in enumerate(distinct)}

    # Jobs that share the other swept keys' values form one line, ordered along x.
    series: dict[str, list[tuple[float, Job]]] = {}
    for job, label in zip(jobs, labels, strict=True):
        name = " ".join(f"{k}={job.override_values.get(k, '')}" for k in keys[1:])
        series.setdefault(name, []).append((position[label], job))

    # Rows of four: the metric panels, and the last says what the plot leaves out.
    panels = PANELS + (SLO_PANELS if _has_slo(jobs) else [])
    rows = -(-(len(panels) + 1) // 4)
    fig, axes = plt.subplots(rows, 4, figsize=(17, 3.75 * rows))
    flat = list(axes.flat)
    for ax, (column, title) in zip(flat, panels, strict=False):
        for name, points in series.items():
            points.sort(key=lambda p: p[0])
            ys = [_nan_if_none(job.value(column)) for _, job in points]
            ax.plot([x for x, _ in points], ys, marker="o", label=name or None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(x_key)
        ax.grid(True, alpha=0.3)
        _x_axis(ax, numbers, position, distinct)
    if len(series) > 1:
        flat[0].legend(fontsize=8)
    for ax in flat[len(panels) : -1]:
        ax.axis("off")
    _notes(flat[-1], jobs, keys, x_key)
    fig.suptitle(f"Sweep {path.parent}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def _notes(ax: Any, jobs: Sequence[Job], keys: Sequence[str], x_key: str) -> None:
    ax.axis("off")
    failed = [j for j in jobs if j.status != "ok"]
    text = [f"{len(jobs)} jobs, {len(jobs) - len(failed)} ok", f"x: {x_key}"]
    if any(j.metrics.get("simulated") for j in jobs):
        text.append("simulated: predicted figures")
    if failed:
        text += ["", "no point for:"]
        text += [f"job {j.num} ({j.status}) {' '.join(_own(j, keys))}" for j in failed]
    ax.text(0.0, 1.0, "\n".join(text), va="top", fontsize=10, family="monospace", wrap=True)


def _own(job: Job, keys: Sequence[str]) -> list[str]:
    """The job's overrides of the swept keys: what sets it apart from the other jobs."""
    return [o for o in job.overrides if split_override(o)[0] in keys]


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _fmt_tick(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def build_summary(sweep_dir: Path) -> Path:
    """Writes summary.csv, summary.md and summary.png in the sweep folder; returns summary.md."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SummaryError(f"{sweep_dir}: not a folder")
    jobs = find_jobs(sweep_dir)
    if not jobs:
        raise SummaryError(f"{sweep_dir}: no job folders (none holds .hydra/overrides.yaml)")
    keys = swept_keys(jobs)
    write_csv(jobs, sweep_dir / "summary.csv")
    write_markdown(jobs, keys, sweep_dir / "summary.md")
    write_plot(jobs, keys, sweep_dir / "summary.png")
    return sweep_dir / "summary.md"


class SweepSummaryCallback(Callback):
    """Builds the summary once every job of a multirun has finished, whatever the launcher."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.summary",
        description="Build summary.csv, summary.md and summary.png for a multirun folder.",
    )
    parser.add_argument("sweep_dir", type=Path, help="the multirun's folder (hydra.sweep.dir)")
    args = parser.parse_args(argv)
    try:
        path = build_summary(args.sweep_dir)
    except SummaryError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
