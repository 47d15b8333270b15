"""Two runs' configs and metrics side by side: the dotted keys that changed, were added or
removed, and each metric's A, B, difference and ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepdiff import DeepDiff

from pipeline.job.slo import slo_was_set
from pipeline.run_folder.output_keys import echoes, effect

# ---------------------------------------------------------------------------- config


def _dotted(parts: Sequence[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _leaves(prefix: str, value: Any) -> dict[str, Any]:
    """A whole added or removed subtree, as one dotted key per leaf."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    return {prefix: value}


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Changed, added (only in B) and removed (only in A) dotted keys of two configs."""
    diff = DeepDiff(a, b, view="tree")
    changed: dict[str, Any] = {}
    added: dict[str, Any] = {}
    removed: dict[str, Any] = {}
    for kind, levels in diff.items():
        for level in levels:
            key = _dotted(level.path(output_format="list"))
            if kind in ("values_changed", "type_changes"):
                changed[key] = {"a": level.t1, "b": level.t2}
            elif kind.endswith("_added"):
                added.update(_leaves(key, level.t2))
            elif kind.endswith("_removed"):
                removed.update(_leaves(key, level.t1))
    changed, added, removed = _whole_lists(a, b, changed, added, removed)
    _mark_not_in_force(a, b, changed)
    _fold_echoes(a, changed)
    for key, entry in changed.items():
        entry["effect"] = str(effect(key))
    return {"changed": dict(sorted(changed.items())), "added": added, "removed": removed}


def _fold_echoes(a: dict[str, Any], changed: dict[str, Any]) -> None:
    """A group's copy of a top-level key (`scheduler.max_tokens` for `max_tokens`) that
    changed with it is said once, as the top-level key, naming its copies."""
    for key in list(changed):
        top = echoes(key, a)
        if top in changed and changed[top]["a"] == changed[key]["a"] == a[top]:
            changed[top].setdefault("copies", []).append(key)
            del changed[key]


def _at(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _whole_lists(
    a: dict[str, Any],
    b: dict[str, Any],
    changed: dict[str, Any],
    added: dict[str, Any],
    removed: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A list that differs is one key with both lists (`sizes: [1, 2] -> [1, 4]`), not a
    line per element."""
    lists = {k.split("[", 1)[0] for k in (*changed, *added, *removed) if "[" in k}
    for key in lists:
        for found in (changed, added, removed):
            for k in [k for k in found if k.split("[", 1)[0] == key]:
                del found[k]
        va, vb = _at(a, key), _at(b, key)
        if va is None:
            added[key] = vb
        elif vb is None:
            removed[key] = va
        else:
            changed[key] = {"a": va, "b": vb}
    return changed, added, removed


BUCKET_AXES = ("prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch", "decode_blocks")


def _mark_not_in_force(a: dict[str, Any], b: dict[str, Any], changed: dict[str, Any]) -> None:
    """A bucket axis with explicit `sizes` ignores its min/step/max and the strategy: a
    change there was not in force in a run whose axes had sizes, and the diff says so."""
    for key, entry in changed.items():
        parts = key.split(".")
        if parts[0] != "metadata":
            continue
        axes: tuple[str, ...]
        if key == "metadata.bucketing":
            axes = BUCKET_AXES
        elif len(parts) == 3 and parts[1] in BUCKET_AXES and parts[2] in ("min", "step", "max"):
            axes = (parts[1],)
        else:
            continue
        sides = [
            side.upper()
            for side, cfg in (("a", a), ("b", b))
            if all(_at(cfg, f"metadata.{axis}.sizes") for axis in axes)
        ]
        if sides:
            entry["note"] = f"not in force in {' and '.join(sides)}: the axes' sizes were"


# --------------------------------------------------------------------------- metrics


def _numbers(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flattens metrics.json to dotted keys (ttft_ms.p50, ...), numbers and strings alike."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_numbers(value, name))
        elif key != "error":  # a failure message is not a metric; the verdict reports it
            out[name] = value
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


SLO_KEYS = ("request_goodput", "slo_attainment", "slo_met", "slo.", "slo_attainment_by_bound")


def metrics_table(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each metric of either run: A, B, B - A and B / A (None where it does not apply);
    the SLO's figures only where either run had an SLO bound (without one they say
    nothing: every request is good)."""
    flat_a, flat_b = _numbers(a), _numbers(b)
    if not (slo_was_set(a) or slo_was_set(b)):
        flat_a, flat_b = ({k: v for k, v in f.items() if not k.startswith(SLO_KEYS)}
                          for f in (flat_a, flat_b))  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    for key in [*flat_a, *(k for k in flat_b if k not in flat_a)]:
        va, vb = flat_a.get(key), flat_b.get(key)
        row: dict[str, Any] = {"a": va, "b": vb, "delta": None, "ratio": None}
        if _is_number(va) and _is_number(vb):
            row["delta"] = vb - va
            row["ratio"] = vb / va if va else None
        rows[key] = row
    return rows
