"""A capacity search's reports: capacity.json, capacity.md (each probe's load, offered
request rate, attainment, goodput and verdict), the folder's metrics.json, and the line
printed at the end."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.plan.probes import LoadAxis, Probe
from pipeline.run_folder import artefacts

CAPACITY_JSON, CAPACITY_MD = "capacity.json", "capacity.md"


def write_reports(
    axis: LoadAxis, probes: list[Probe], slo: str, result: dict[str, Any], out_dir: Path
) -> None:
    """The search's reports; `slo` describes the SLO and its attainment target."""
    probes = sorted(probes, key=lambda p: p.load)
    document = {
        "key": axis.key,
        "unit": axis.unit,
        "slo": result.get("slo"),
        "capacity": result["capacity"],
        "capacity_above": result["capacity_above"],
        "found": result["capacity_found"],
        "probes": [asdict(p) for p in probes],
    }
    artefacts.replace_text(out_dir / CAPACITY_JSON, json.dumps(document, indent=2) + "\n")
    artefacts.replace_text(out_dir / CAPACITY_MD, capacity_markdown(axis, slo, result, probes))
    artefacts.write_metrics(result, out_dir)


def capacity_markdown(axis: LoadAxis, slo: str, result: dict[str, Any], probes: list[Probe]) -> str:
    above = result["capacity_above"]
    if not result["capacity_found"]:
        verdict = result["capacity_reason"]
    else:
        verdict = (
            f"capacity {result['capacity']:.4g} {axis.unit} ({result['capacity_rps']:.4g} req/s); "
        )
        verdict += (
            f"{above:.4g} missed"
            if above is not None
            else "no load above it was probed within capacity.max_probes: a lower bound"
        )
    lines = [
        f"# Capacity search: {axis.key}",
        "",
        f"{slo}: {verdict}.",
        "",
        f"| load ({axis.unit}) | {axis.key} | offered req/s | attainment | goodput req/s | met "
        "| status | folder |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in probes:
        cells = [
            f"{p.load:.4g}",
            f"{axis.value(p.load):.4g}",
            "-" if p.offered_rps is None else f"{p.offered_rps:.4g}",
            "-" if p.attainment is None else f"{p.attainment:.3f}",
            f"{p.goodput:.4g}",
            "yes" if p.met else "no",
            p.status,
            p.folder,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def print_result(
    result: dict[str, Any], out_dir: Path, write: Callable[[str], Any] = print
) -> None:
    if result["capacity_found"]:
        write(
            f"capacity: {result['capacity']:.4g} {result['capacity_unit']} "
            f"({result['capacity_key']}={result['capacity_value']:.4g}, "
            f"{result['capacity_rps']:.4g} req/s) in {out_dir}"
        )
    else:
        write(f"capacity: none: {result['capacity_reason']} ({out_dir}/{CAPACITY_MD})")
