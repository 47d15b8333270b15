"""The review document as plain text: config, metrics, outputs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pipeline.review.outputs import verdict_line


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append(indent + "  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return [line.rstrip() for line in lines]


def render(doc: dict[str, Any]) -> str:
    """The review as plain text: config, metrics, outputs."""
    out = [f"A: {doc['a']}", f"B: {doc['b']}", ""]
    out += render_config(doc["config"])
    out += ["", "== Metrics (metrics.json) =="]
    rows = [
        [k, _cell(r["a"]), _cell(r["b"]), _cell(r["delta"]), _ratio(r["ratio"])]
        for k, r in doc["metrics"].items()
    ]
    out += _table(["metric", "A", "B", "B - A", "B / A"], rows) if rows else ["  no metrics"]
    out += trap_notes(doc["metrics"])
    out += graph_note(doc["config"], doc["metrics"])
    out += ["", "== Outputs (generations.jsonl) ==", verdict_line(doc["outputs"])]
    for d in doc["outputs"].get("differences", []):
        out += _render_difference(d)
    return "\n".join(out)


def trap_notes(metrics: dict[str, dict[str, Any]]) -> list[str]:
    """Said in words, not left in the table: a run that compiled graphs while serving (its
    latencies hold compile time), and a run that missed its SLO."""
    out = []
    compiles = metrics.get("serving_compiles", {})
    seconds = metrics.get("serving_compile_s", {})
    for side in ("a", "b"):
        if compiles.get(side):
            out.append(
                f"  note: {side.upper()} compiled {compiles[side]} graphs while serving "
                f"({_cell(seconds.get(side))} s predicted): its latencies include them"
            )
        bounds = [k for k in metrics if k.startswith("slo.") and k != "slo.attainment"]
        if bounds and metrics.get("slo_met", {}).get(side) is False:
            attained = metrics.get("slo_attainment", {}).get(side)
            target = metrics.get("slo.attainment", {}).get(side)
            out.append(f"  note: {side.upper()} missed its SLO ({_cell(attained)} < {target})")
    return out


def render_config(cfg: dict[str, Any]) -> list[str]:
    out = ["== Config (resolved_config.yaml) =="]
    if not (cfg["changed"] or cfg["added"] or cfg["removed"]):
        out.append("  no differences")
    if cfg["changed"]:
        out.append("changed:")
        out += [_changed_line(k, v) for k, v in cfg["changed"].items()]
    if cfg["added"]:
        out.append("added (only in B):")
        out += [f"  {k}: {v!r}" for k, v in cfg["added"].items()]
    if cfg["removed"]:
        out.append("removed (only in A):")
        out += [f"  {k}: {v!r}" for k, v in cfg["removed"].items()]
    ca, cb = cfg["choices"]["a"], cfg["choices"]["b"]
    groups = [*ca, *(g for g in cb if g not in ca)]
    if groups:
        out.append("group choices:")
        rows = [
            [g, ca.get(g, "-"), cb.get(g, "-"), "" if ca.get(g) == cb.get(g) else "<- differs"]
            for g in groups
        ]
        out += _table(["group", "A", "B", ""], rows)
    out.append("overrides:")
    for side in ("a", "b"):
        given = cfg["overrides"][side]
        shown = "(unknown: no .hydra/overrides.yaml)" if given is None else " ".join(given)
        out.append(f"  {side.upper()}: {shown or '(none)'}")
    return out


def _changed_line(key: str, v: dict[str, Any]) -> str:
    """One changed key, what it does to outputs, and the group copies that follow it."""
    line = f"  {key}: {v['a']!r} -> {v['b']!r}  [{v.get('effect', '')}]"
    if v.get("copies"):
        line += f" (also {', '.join(v['copies'])})"
    return line + (f"  ({v['note']})" if v.get("note") else "")


def graph_note(cfg: dict[str, Any], metrics: dict[str, dict[str, Any]]) -> list[str]:
    """Why warmup graph counts differ when only the attention stage does: the reference
    attention reads no paged cache, so it serves without prefix caching and its decode
    block axis ends at the pool (no rows sharing cached blocks)."""
    choices = cfg["choices"]
    shapes = metrics.get("warmup_shapes", {})
    differs = choices["a"].get("attention") != choices["b"].get("attention")
    if (
        not differs
        or shapes.get("a") == shapes.get("b")
        or None in (shapes.get("a"), shapes.get("b"))
    ):
        return []
    return [
        f"  note: warmup graphs {shapes['a']} (A, attention={choices['a'].get('attention')}) "
        f"vs {shapes['b']} (B, attention={choices['b'].get('attention')}): the reference "
        "attention has no prefix caching (it recomputes every token), so its decode block "
        "axis ends at the pool instead of rows x a full row"
    ]


def _render_difference(d: dict[str, Any]) -> list[str]:
    """Where one request's outputs part, with both continuations."""
    if d["position"] is None:
        return [f"  {d['id']}: {d['note']}"]
    lengths = f"{d['lengths']['a']}/{d['lengths']['b']} tokens"
    before = d["context"] if d["position"] else "(start of the output)"
    out = [
        f"  {d['id']}: first differs at token {d['position']} ({lengths})",
        f"    before: {before}",
        f"    A: {d['a']}",
        f"    B: {d['b']}",
    ]
    for side in ("a", "b"):
        if d["errors"][side]:
            out.append(f"    {side.upper()} error: {d['errors'][side]}")
    return out


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"
