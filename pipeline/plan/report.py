"""A plan's report, built from its job folders once every capacity search has finished:
the table, the Pareto front of output tokens/s per card against tokens/s per user, the best
configuration for `plan.objective`, and its deploy files.

Per card: a tp=N deployment takes N cards, so its rates are divided by N. Tokens/s per user
is 1000 / mean TPOT (ms), AIConfigurator's axis. Cost per million output tokens is
`plan.device_hour_usd` x cards / (output tokens/s x 3600) x 1e6.
"""

from __future__ import annotations

import csv
import enum
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from pipeline.artefacts import RESOLVED_CONFIG
from pipeline.checks import ConfigError
from pipeline.deploy import deployment, tool_overrides, write_deploy
from pipeline.plan.target import target_of
from pipeline.run_folder import RunStatus
from pipeline.slo import Slo
from pipeline.summary import Job, find_jobs, split_override, swept_keys

log = logging.getLogger(__name__)


class Objective(enum.StrEnum):
    """What the plan ranks eligible configurations by (`plan.objective`)."""

    GOODPUT_PER_CARD = "goodput_per_card"  # requests/s meeting the SLO, per card: the most
    COST = "cost"  # USD per million output tokens at plan.device_hour_usd: the least


PLAN_CSV, PLAN_MD, PARETO_PNG, BEST_JSON = "plan.csv", "plan.md", "pareto.png", "best.json"


@dataclass
class Candidate:
    """One configuration of the plan at its capacity."""

    job: Job
    config: dict[str, Any]
    ruled_out: str = ""  # why it cannot be chosen ("" = it can)

    def metric(self, *keys: str) -> float | None:
        node: Any = self.job.metrics
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return (
            float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None
        )

    @property
    def cards(self) -> int:
        return int(self.config.get("tp", 1) or 1)

    @property
    def capacity_rps(self) -> float:
        return self.metric("capacity_rps") or 0.0

    @property
    def goodput_per_card(self) -> float:
        return (self.metric("request_goodput") or 0.0) / self.cards

    @property
    def tokens_per_card(self) -> float:
        return (self.metric("output_throughput") or 0.0) / self.cards

    @property
    def tokens_per_user(self) -> float | None:
        tpot = self.metric("tpot_ms", "mean")
        return 1000.0 / tpot if tpot else None

    @property
    def compiles(self) -> int:
        return int(self.metric("serving_compiles") or 0)

    def cost_per_mtok(self, usd_per_hour: float) -> float | None:
        tokens = self.metric("output_throughput")
        if not usd_per_hour or not tokens:
            return None
        return usd_per_hour * self.cards / (tokens * 3600) * 1e6


def candidates(jobs: Sequence[Job], max_warmup_s: float) -> list[Candidate]:
    """Every job, with the reason it is ruled out, if any: it failed, no load met the SLO,
    or its predicted warmup outlasts plan.max_warmup_s."""
    out = []
    for job in jobs:
        resolved = job.path / RESOLVED_CONFIG
        config = yaml.safe_load(resolved.read_text(encoding="utf-8")) if resolved.is_file() else {}
        c = Candidate(job, config or {})
        warmup = c.metric("predicted_warmup_s")
        if job.status != RunStatus.OK:
            c.ruled_out = f"{job.status}: {job.error}"
        elif not job.metrics.get("capacity_found"):
            c.ruled_out = str(job.metrics.get("capacity_reason") or "no load met the SLO")
        elif max_warmup_s and warmup is not None and warmup > max_warmup_s:
            c.ruled_out = f"warmup {warmup:,.0f} s > plan.max_warmup_s={max_warmup_s:g}"
        out.append(c)
    return out


def best(cands: Sequence[Candidate], objective: Objective, usd: float) -> Candidate | None:
    """The eligible candidate with the most goodput per card, or the lowest cost per
    million output tokens; ties go to the shorter warmup."""
    eligible = [c for c in cands if not c.ruled_out]
    if not eligible:
        return None

    def warmup(c: Candidate) -> float:
        return c.metric("predicted_warmup_s") or 0.0

    if objective == Objective.COST:
        return min(eligible, key=lambda c: (c.cost_per_mtok(usd) or math.inf, warmup(c)))
    return max(eligible, key=lambda c: (c.goodput_per_card, -warmup(c)))


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Eligible candidates no other beats on both tokens/s per card and per user."""
    points = [c for c in cands if not c.ruled_out and c.tokens_per_user is not None]

    def dominated(c: Candidate) -> bool:
        return any(
            o.tokens_per_card >= c.tokens_per_card
            and o.tokens_per_user >= c.tokens_per_user
            and (o.tokens_per_card, o.tokens_per_user) != (c.tokens_per_card, c.tokens_per_user)
            for o in points
        )

    return sorted((c for c in points if not dominated(c)), key=lambda c: c.tokens_per_user or 0)


COLUMNS = [
    "job", "config", "capacity", "capacity_rps", "goodput_per_card", "output_tok_s_per_card",
    "tok_s_per_user", "ttft_p90_ms", "tpot_p90_ms", "slo_attainment", "warmup_s", "graphs",
    "kv_blocks", "serving_compiles", "cost_per_mtok_usd", "note",
]  # fmt: skip


def row(c: Candidate, keys: Sequence[str], usd: float) -> dict[str, Any]:
    own = [o for o in c.job.overrides if split_override(o)[0] in keys]
    note = c.ruled_out
    if c.compiles and not note:
        seconds = c.metric("serving_compile_s") or 0.0
        note = f"compiled {_graphs(c.compiles)} while serving ({seconds:,.0f} s)"
    return {
        "job": c.job.num,
        "config": " ".join(own),
        "capacity": c.metric("capacity"),
        "capacity_rps": c.capacity_rps,
        "goodput_per_card": c.goodput_per_card,
        "output_tok_s_per_card": c.tokens_per_card,
        "tok_s_per_user": c.tokens_per_user,
        "ttft_p90_ms": c.metric("ttft_ms", "p90"),
        "tpot_p90_ms": c.metric("tpot_ms", "p90"),
        "slo_attainment": c.metric("slo_attainment"),
        "warmup_s": c.metric("predicted_warmup_s"),
        "graphs": c.metric("warmup_shapes"),
        "kv_blocks": c.metric("num_blocks"),
        "serving_compiles": c.compiles,
        "cost_per_mtok_usd": c.cost_per_mtok(usd),
        "note": note,
    }


def _graphs(n: int) -> str:
    return f"{n} graph" if n == 1 else f"{n} graphs"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_table(rows: list[dict[str, Any]], header: str, folder: Path) -> str:
    with open(folder / PLAN_CSV, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
        *("| " + " | ".join(_fmt(r[k]).replace("|", "\\|") for k in COLUMNS) + " |" for r in rows),
    ]
    table = "\n".join(lines)
    (folder / PLAN_MD).write_text(f"{header}\n\n{table}\n\n![Pareto front]({PARETO_PNG})\n")
    return table


def write_pareto(cands: Sequence[Candidate], chosen: Candidate | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    shown = [c for c in cands if c.tokens_per_user is not None and not c.ruled_out]
    ax.scatter([c.tokens_per_user for c in shown], [c.tokens_per_card for c in shown], color="0.6")
    for c in shown:
        ax.annotate(str(c.job.num), (c.tokens_per_user, c.tokens_per_card), fontsize=7)
    front = pareto_front(cands)
    ax.plot(
        [c.tokens_per_user for c in front],
        [c.tokens_per_card for c in front],
        "o-",
        color="tab:blue",
        label="Pareto front",
    )
    if chosen is not None and chosen.tokens_per_user is not None:
        ax.scatter([chosen.tokens_per_user], [chosen.tokens_per_card], s=160, marker="*",
                   color="tab:red", label=f"best (job {chosen.job.num})", zorder=3)  # fmt: skip
    ax.set_xlabel("output tokens/s per user (1000 / mean TPOT ms)")
    ax.set_ylabel("output tokens/s per card, at capacity")
    ax.set_title("Plan: each configuration at its capacity under the SLO (simulated)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_plan_report(
    plan_dir: Path, settings: DictConfig | dict[str, Any], tolerance: float = 0.0
) -> str:
    """Writes the table, the plot, best.json and deploy/; returns what to print.
    tolerance: the capacity search's (said in plan.md's header)."""
    jobs = find_jobs(plan_dir)
    if not jobs:
        raise ValueError(f"{plan_dir}: no job folders")
    objective = Objective(str(settings["objective"]))
    usd = float(settings["device_hour_usd"] or 0.0)
    cands = candidates(jobs, float(settings["max_warmup_s"] or 0.0))
    chosen = best(cands, objective, usd)
    keys = swept_keys(jobs)
    rows = [row(c, keys, usd) for c in cands]
    header = f"# Plan: {plan_dir}\n\n{len(cands)} configurations; objective `{objective}`."
    searched = [c.job.metrics for c in cands if c.job.metrics.get("capacity_key")]
    if searched:
        unit, key = searched[0].get("capacity_unit"), searched[0]["capacity_key"]
        header += f" `capacity` is in {unit} (`{key}`); `capacity_rps` is requests/s."
    if tolerance:
        header += (
            f" Each capacity is bisected to a relative tolerance of {tolerance:g} "
            f"(`capacity.tolerance`): the next load probed above it, at most {1 + tolerance:g} "
            "times it (a concurrency: one more), missed."
        )
    table = write_table(rows, header, plan_dir)
    write_pareto(cands, chosen, plan_dir / PARETO_PNG)
    if chosen is None:
        return f"{table}\n\nNo configuration met the SLO within the limits: see {PLAN_MD}"
    num_blocks = int(chosen.metric("num_blocks") or 1)
    model = str(settings.get("model_id") or "")
    overrides = tool_overrides(chosen.job.overrides, chosen.config)
    write_deploy(deployment(chosen.config, num_blocks, model), overrides, plan_dir / "deploy")
    document = {"job": chosen.job.num, "overrides": chosen.job.overrides,
                "row": row(chosen, keys, usd), "objective": objective}  # fmt: skip
    (plan_dir / BEST_JSON).write_text(json.dumps(document, indent=2) + "\n")
    lines = [table, "", f"best for {objective}: job {chosen.job.num}: " + " ".join(
        chosen.job.overrides)]  # fmt: skip
    if chosen.compiles:
        lines.append(f"note: it compiled {_graphs(chosen.compiles)} while serving")
    lines.append(f"deploy files: {plan_dir / 'deploy'}")
    return "\n".join(lines)


def check_plan(cfg: DictConfig) -> None:
    """The plan's own keys, and an SLO to search under; a ConfigError names the key."""
    plan = cfg.plan
    objectives = [o.value for o in Objective]
    if plan.objective not in objectives:
        raise ConfigError(f"plan.objective={plan.objective}: choose one of {', '.join(objectives)}")
    if plan.objective == Objective.COST and not plan.device_hour_usd > 0:
        raise ConfigError("plan.objective=cost needs plan.device_hour_usd (one card's hour, USD)")
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
