"""A device profile as the YAML file conf/hardware/ holds: the shipped profile's spec-sheet
comments, and the profile's fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import yaml

from stages.simulator.hardware import HardwareProfile

CONF = Path(str(resources.files("pipeline.conf") / "hardware"))  # installed or a checkout


def spec_sheet_comments(name: str) -> list[str]:
    """The shipped profile's leading comments, up to what a fit or a guess says."""
    path = CONF / f"{name}.yaml"
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = []
    for line in lines:
        if not line.startswith("#") or line.startswith(("# UNCALIBRATED", "# FITTED")):
            break
        kept.append(line)
    return kept


def profile_fields(profile: HardwareProfile) -> list[str]:
    """The profile's fields as YAML lines (its coefficients as a mapping, if any)."""
    lines = []
    for f in dataclasses.fields(profile):
        value = getattr(profile, f.name)
        if f.name == "coefficients":
            if value:
                lines.append("coefficients:")
                lines += [f"  {k}: {v:.6g}" for k, v in value.items()]
            continue
        if f.name in ("software", "errors"):  # a quoted string; a mapping by method
            flow = yaml.safe_dump({f.name: _plain(value)}, default_flow_style=False, width=200)
            lines += flow.rstrip("\n").splitlines()
            continue
        shown = str(value).lower() if isinstance(value, bool) else _number(value)
        lines.append(f"{f.name}: {shown}")
    return lines


def _plain(value: object) -> object:
    """Mappings as dicts (a profile's fields may be read-only mappings) for YAML."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) >= 1e-4 or value == 0 else f"{value:.4e}"
    return str(value)
