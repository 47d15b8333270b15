"""Two plan jobs, or two plans, side by side: `python -m pipeline.review A B` where A and B are
plan job folders (a capacity search each: capacity.json) or plan folders (best.json).

A plan job's figures: its config diff, one replica's capacity (in its unit and req/s),
attainment and goodput per card (capacity_rps x attainment / tp), and at a target the
replicas, cards, headroom and $/hour (cards x the job's own plan.prices). A plan's: its best
configuration overall and on each device, with the same figures from best.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.layout import layout_of
from pipeline.review.compare import config_diff
from pipeline.review.runs import ReviewError

FIGURES = (
    "capacity", "capacity_rps", "slo_attainment", "goodput_per_card", "tp", "replica_cards",
    "replicas", "cards", "headroom", "usd_per_hour", "warmup_s",
)  # fmt: skip


def is_plan_job(path: Path) -> bool:
    return (path / "capacity.json").is_file() and (path / "metrics.json").is_file()


def is_plan(path: Path) -> bool:
    return (path / "best.json").is_file()


def handles(a: Path, b: Path) -> bool:
    """Both plan jobs, or both plans (a run's review is pipeline.review's own)."""
    return (is_plan_job(a) and is_plan_job(b)) or (is_plan(a) and is_plan(b))


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise ReviewError(f"{path}: cannot read ({err})") from err


def job_figures(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A plan job's resolved config and its figures (FIGURES)."""
    config = _read(path / "resolved_config.yaml") or {}
    m = _read(path / "metrics.json")
    layout = layout_of(config)  # a replica: dp simulated replicas on layout.cards cards
    scale = layout.capacity_scale
    rps, attainment = (m.get("capacity_rps") or 0.0) * scale, m.get("slo_attainment") or 0.0
    target = m.get("target") or {}
    device = (config.get("hardware") or {}).get("name")
    price = ((config.get("plan") or {}).get("prices") or {}).get(device) or 0.0
    cards = target.get("cards")
    figures = {
        "device": device,
        "capacity": None if m.get("capacity") is None else m["capacity"] * scale,
        "capacity_unit": m.get("capacity_unit"),
        "capacity_rps": rps,
        "slo_attainment": attainment,
        "goodput_per_card": rps * attainment / layout.cards,
        "tp": layout.tp,
        "replica_cards": layout.cards,
        "replicas": target.get("replicas"),
        "cards": cards,
        "headroom": target.get("headroom"),
        "usd_per_hour": cards * price if cards and price else None,
        "warmup_s": m.get("predicted_warmup_s"),
        "note": m.get("capacity_reason") or "",
    }
    return config, figures


def _side_by_side(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in FIGURES:
        va, vb = a.get(key), b.get(key)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        ratio = vb / va if numbers and va else None
        rows.append({"figure": key, "a": va, "b": vb, "ratio": ratio})
    return rows


def review_jobs(a: Path, b: Path) -> dict[str, Any]:
    config_a, figures_a = job_figures(a)
    config_b, figures_b = job_figures(b)
    return {"kind": "plan jobs", "a": str(a), "b": str(b),
            "config": config_diff(config_a, config_b),
            "devices": {"a": figures_a["device"], "b": figures_b["device"]},
            "figures": _side_by_side(figures_a, figures_b)}  # fmt: skip


def review_plans(a: Path, b: Path) -> dict[str, Any]:
    best_a, best_b = _read(a / "best.json"), _read(b / "best.json")
    per_device = {}
    for device in sorted(set(best_a.get("per_device", {})) | set(best_b.get("per_device", {}))):
        one = best_a.get("per_device", {}).get(device, {})
        two = best_b.get("per_device", {}).get(device, {})
        figures = _side_by_side(one.get("row", {}), two.get("row", {}))
        per_device[device] = {
            "jobs": {"a": one.get("job"), "b": two.get("job")},
            "figures": figures,
        }
    return {"kind": "plans", "a": str(a), "b": str(b),
            "best": {"a": _label(best_a), "b": _label(best_b)},
            "figures": _side_by_side(best_a.get("row", {}), best_b.get("row", {})),
            "per_device": per_device}  # fmt: skip


def _label(best: Mapping[str, Any]) -> str:
    return f"job {best.get('job')} ({best.get('device')}): " + " ".join(best.get("overrides", []))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| figure | A | B | B / A |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['figure']} | {_fmt(r['a'])} | {_fmt(r['b'])} | {_fmt(r['ratio'])} |"
              for r in rows]  # fmt: skip
    return lines


def render_plans(doc: Mapping[str, Any]) -> str:
    """The review as markdown."""
    lines = [f"# Review of {doc['kind']}: A = {doc['a']}, B = {doc['b']}", ""]
    if doc["kind"] == "plan jobs":
        config = doc["config"]
        lines += ["## Config", ""]
        for key, change in config["changed"].items():
            lines.append(f"- `{key}`: {change['a']} -> {change['b']}")
        for key, value in config["added"].items():
            lines.append(f"- `{key}`: only in B ({value})")
        for key, value in config["removed"].items():
            lines.append(f"- `{key}`: only in A ({value})")
        lines += ["", "## One replica at capacity, and at the target", "", *_table(doc["figures"])]
        return "\n".join(lines) + "\n"
    lines += [f"Best: A {doc['best']['a']}; B {doc['best']['b']}", "", *_table(doc["figures"])]
    for device, part in doc["per_device"].items():
        jobs = part["jobs"]
        lines += ["", f"## Best on {device}: A job {jobs['a']}, B job {jobs['b']}", ""]
        lines += _table(part["figures"])
    return "\n".join(lines) + "\n"


def review_plan_pair(a: Path, b: Path) -> dict[str, Any]:
    """The review of two plan jobs, or of two plans."""
    return review_jobs(a, b) if is_plan_job(a) and is_plan_job(b) else review_plans(a, b)
