"""A plan's report, built from its job folders once every capacity search has finished:
the ranked table (pipeline/plan/table.py), the Pareto plot, best.json, and the deploy files
of each device's best configuration (deploy/DEVICE/).

The ranking (pipeline/plan/candidates.py): at a target load, by the central $/hour of all
the cards it takes (`plan.prices`); without one, by `plan.objective`. A row whose band
overlaps the first's is marked in the `tie` column and stays where its central figure puts
it; equal central figures go to more headroom, more KV memory, then shorter readiness.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from pipeline.config.checks import ConfigError
from pipeline.deploy import deployment, tool_overrides, write_deploy
from pipeline.job.slo import Slo
from pipeline.plan.acceptance import acceptance_note
from pipeline.plan.candidates import PREFERENCES, Candidate, Ranking, rank, read_candidates
from pipeline.plan.page import write_plan_page
from pipeline.plan.table import (
    PARETO_PNG,
    PLAN_MD,
    band_ends,
    graphs_text,
    row,
    write_pareto,
    write_table,
)
from pipeline.plan.target import target_of
from pipeline.run_folder.reader import RunStatus
from pipeline.run_folder.run_files import output_folder, write_file
from pipeline.schema import schema_view
from pipeline.schema.plan import Objective
from pipeline.summary import find_jobs, swept_keys

log = logging.getLogger(__name__)

BEST_JSON = "best.json"


def _header(plan_dir: Path, cands: Sequence[Candidate], ranking: Ranking, tolerance: float) -> str:
    devices = sorted({c.device for c in cands})
    lines = [
        f"# Plan: {plan_dir}",
        "",
        f"{len(cands)} configurations on {', '.join(devices)}; ranked by `{ranking.by}`"
        + (" (lower first)." if ranking.by != "goodput_per_card" else " (higher first)."),
    ]
    searched = [c.job.metrics for c in cands if c.job.metrics.get("capacity_key")]
    if searched:
        unit, key = searched[0].get("capacity_unit"), searched[0]["capacity_key"]
        lines.append(
            f"Per replica: `capacity` in {unit} (`{key}`), `capacity_rps` in requests/s, "
            "`replica_cards` cards (tp x dp; disaggregated: prefill x prefill_tp + decode x "
            "decode_tp). Per card: goodput = capacity_rps x attainment / replica_cards."
        )
    sized = next((c.target for c in cands if c.target), None)
    if sized:
        lines.append(
            f"Target: {sized['target']:g} {sized['unit']}: `replicas` = ceil(target / "
            "capacity), `cards` = replicas x replica_cards, `headroom` = replicas x capacity / "
            "target - 1, "
            "`check_attainment`: one replica served at target / replicas."
        )
    if tolerance:
        lines.append(f"Capacities are bisected to a relative tolerance of {tolerance:g}.")
    lines.append(
        f"Order: by the central `{ranking.by}` alone; equal figures go to {PREFERENCES}. "
        "`tie`: the row's band overlaps the first's (the figures cannot tell them apart); "
        "it never moves a row."
    )
    lines += ["", "Bands (pipeline/plan/bands.py: the device's held-out calibration error and "
              "each feature's published check, compounded; unchecked: the widest):"]  # fmt: skip
    described: dict[str, list[str]] = {}
    for c in cands:
        band = c.band
        release = band.software or "software release not stated in the profile"
        key = f"{c.device}: {band.describe()}; figures describe {release}"
        described.setdefault(key, []).append(str(c.job.num))
    lines += [f"- jobs {', '.join(jobs)}: {text}" for text, jobs in described.items()]
    if ranking.note:
        lines += ["", ranking.note]
    return "\n".join(lines)


# The figures that make two rows the same answer (their configs differ in a setting the
# load never reached, e.g. a max_num_seqs above what it held).
SAME = ("device", "replica_cards", "capacity", "capacity_rps", "ttft_p90_ms", "tpot_p90_ms",
        "replicas", "cards", "usd_per_hour", "kv_blocks")  # fmt: skip


def said_same(rows: Sequence[dict[str, Any]]) -> None:
    """A row whose figures equal an earlier one's says so in its note (one answer, not two)."""
    first: dict[tuple[Any, ...], int] = {}
    for r in rows:
        if r.get("capacity") is None:
            continue
        key = tuple(r.get(k) for k in SAME)
        if key in first:
            same = f"same figures as job {first[key]}"
            r["note"] = f"{r['note']}; {same}" if r.get("note") else same
        else:
            first[key] = r["job"]


def _deploy(
    c: Candidate, keys: Sequence[str], prices: Mapping[str, float], model: str, out: Path
) -> dict[str, Any]:
    num_blocks = int(c.metric("num_blocks") or 1)
    overrides = tool_overrides(c.job.overrides, c.config)
    plan = shlex.quote(str(out.parent.parent))
    origin = f"as planned by python -m pipeline.plan ({plan}, job {c.job.num})"
    if c.acceptance_assumed:
        origin += f"; {acceptance_note(c.config)}"
    d = deployment(c.config, num_blocks, model, origin=origin, replicas=c.replicas)
    written = write_deploy(d, overrides, out)
    return {**_best(c, keys, prices), "deploy": [str(p) for p in written]}


def _best(c: Candidate, keys: Sequence[str], prices: Mapping[str, float]) -> dict[str, Any]:
    """best.json's account of one configuration: its row and each predicted figure's band."""
    figures = row(c, keys, prices)
    bands = {k: list(ends) for k, ends in band_ends(c, figures, prices).items()}
    return {"job": c.job.num, "device": c.device, "overrides": c.job.overrides, "row": figures,
            "bands": bands, "band": c.band.describe(), "software": c.band.software}  # fmt: skip


ALL_FAILED = "Error: every job of the plan failed"


def build_plan_report(
    plan_dir: Path, settings: DictConfig | Mapping[str, Any], tolerance: float = 0.0
) -> str:
    """Writes the table, the plot, best.json and deploy/DEVICE/; returns what to print.
    tolerance: the capacity search's (configurations within it of the best are tied)."""
    jobs = find_jobs(plan_dir)
    if not jobs:
        raise ValueError(f"{plan_dir}: no job folders")
    objective = Objective(str(settings["objective"]))
    prices = {str(k): float(v) for k, v in dict(settings.get("prices") or {}).items()}
    cands = read_candidates(jobs, float(settings.get("max_warmup_s") or 0.0))
    ranking = rank(cands, objective, prices, tolerance)
    keys = swept_keys(jobs)
    ordered = ranking.order + [c for c in cands if c.ruled_out]
    ranks = {id(c): i + 1 for i, c in enumerate(ranking.order)}
    ties = {id(c): f"with #1 (job {ranking.tied[0].job.num})" for c in ranking.tied[1:]}
    rows = [row(c, keys, prices, ranks.get(id(c)), ties.get(id(c), "")) for c in ordered]
    said_same(rows)
    header = _header(plan_dir, cands, ranking, tolerance)
    table = write_table(ordered, rows, prices, header, plan_dir)
    chosen = ranking.order[0] if ranking.order else None
    write_pareto(cands, chosen, plan_dir / PARETO_PNG)
    write_plan_page(plan_dir, ordered, rows, prices, ranking)
    failed = [c for c in cands if c.job.status != RunStatus.OK]
    if chosen is None and len(failed) == len(cands):
        first = failed[0].job
        return f"{table}\n\n{ALL_FAILED} (job {first.num}: {first.error}): fix it and plan again"
    if chosen is None:
        return f"{table}\n\nNo configuration met the SLO within the limits: see {PLAN_MD}"
    model = str(settings.get("model_id") or "")
    per_device: dict[str, dict[str, Any]] = {}
    deploy = output_folder(plan_dir / "deploy")  # each device's folder in it: no link either
    for device in sorted({c.device for c in ranking.order}):
        mine = rank([c for c in ranking.order if c.device == device], objective, prices, tolerance)
        best = mine.order[0]
        per_device[device] = _deploy(best, keys, prices, model, deploy / device)
        per_device[device]["tie"] = mine.note
    document = {**_best(chosen, keys, prices), "by": ranking.by, "note": ranking.note,
                "tied": [c.job.num for c in ranking.tied], "objective": objective,
                "per_device": per_device}  # fmt: skip
    write_file(plan_dir / BEST_JSON, json.dumps(document, indent=2) + "\n")
    return _printed(table, ranking, chosen, per_device, plan_dir)


def _printed(
    table: str,
    ranking: Ranking,
    chosen: Candidate,
    per_device: Mapping[str, Mapping[str, Any]],
    plan_dir: Path,
) -> str:
    lines = [table, ""]
    if ranking.note:
        lines.append(ranking.note)
    lines.append(f"best by {ranking.by}: job {chosen.job.num} ({chosen.device}): "
                 + " ".join(chosen.job.overrides))  # fmt: skip
    if chosen.compiles:
        lines.append(f"note: it compiled {graphs_text(chosen.compiles)} while serving")
    for device, best in per_device.items():
        lines.append(f"best on {device}: job {best['job']}; deploy files: "
                     f"{plan_dir / 'deploy' / device}")  # fmt: skip
    return "\n".join(lines)


def check_plan(cfg: DictConfig) -> None:
    """The plan's own keys, and an SLO to search under; a ConfigError names the key."""
    plan = schema_view(cfg).plan
    prices = plan.prices or {}
    for device, price in prices.items():
        if not isinstance(price, (int, float)) or price < 0:
            raise ConfigError(f"plan.prices.{device}={price}: give USD per card-hour, >= 0")
    if plan.max_warmup_s < 0:
        raise ConfigError(f"plan.max_warmup_s={plan.max_warmup_s}: give seconds, or 0 for none")
    try:
        bounds = Slo.of(cfg.slo).bounds
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if not bounds:
        raise ConfigError("a plan needs an SLO: give slo.ttft_ms, slo.tpot_ms or slo.e2e_ms")
    target_of(cfg)


class PlanReport(Callback):
    """Checks the plan's keys before any job starts (one line, exit code 2), and builds the
    report once every job has finished, whatever the launcher."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_plan(config)
        except ConfigError as err:
            print(f"Error: {err}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        plan_dir = Path(config.hydra.sweep.dir)
        try:
            text = build_plan_report(plan_dir, config.plan, config.capacity.tolerance)
        except Exception as err:  # the jobs' folders stay; say how to build it again
            log.error("Plan report failed (%s: %s)", type(err).__name__, err)
            return
        print(text, file=sys.stdout)
        if ALL_FAILED in text:
            sys.exit(1)
