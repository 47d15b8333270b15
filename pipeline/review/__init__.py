"""The config-diff review: what changed between two runs, what it did to the metrics, and
whether the generated tokens are still the same.

    python -m pipeline.review RUN_A RUN_B [--json] [--fail-on-output-diff]
    python -m pipeline.review SWEEP_DIR --baseline K

Exit codes: 0 reviewed; 1 outputs differ (or are not comparable) with --fail-on-output-diff,
the CI gate; 2 bad input (not a run, no generations, runs on different workloads). Workloads are
compared by content (ids, prompts, limits), so a copied workload file is the same one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepdiff import DeepDiff

from pipeline.run_folder import (
    RunFileError,
    RunStatus,
    read_choices,
    read_generations,
    read_mapping,
    read_metrics,
    read_overrides,
)
from pipeline.summary import find_jobs

# Tokens shown around a divergence: enough to recognise the text, short enough for a line.
CONTEXT_TOKENS = 8
CONTINUATION_TOKENS = 12

EXIT_OK, EXIT_OUTPUT_DIFF, EXIT_BAD_INPUT = 0, 1, 2


class ReviewError(Exception):
    """Input the review cannot work with; the message is the one line the user sees."""


@dataclass
class Run:
    """A run folder's files, as the review reads them."""

    path: Path
    config: dict[str, Any]
    choices: dict[str, str]
    overrides: list[str] | None
    metrics: dict[str, Any]
    generations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every request of the workload has its line (a run that ended normally)."""
        return self.metrics.get("status") == RunStatus.OK


def request_key(line: dict[str, Any]) -> dict[str, Any]:
    """What makes a request the same request in two runs: its prompt and its limit."""
    return {"prompt": line.get("prompt"), "max_new_tokens": line.get("max_new_tokens")}


def workload_digest(generations: Sequence[dict[str, Any]]) -> str:
    """A hash of the requests served (ids, prompts, limits), whatever file they came from."""
    keyed = sorted((str(g.get("id")), request_key(g)) for g in generations)
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()


def load_run(path: Path) -> Run:
    """Reads a run folder with the checked readers; ReviewError names the folder, the file
    and, for a file that is not as the pipeline writes it, the line and field."""
    path = Path(path)
    if not path.is_dir():
        raise ReviewError(f"{path}: no such folder")
    if not (path / "resolved_config.yaml").is_file():
        raise ReviewError(f"{path} is not a run folder: it has no resolved_config.yaml")
    try:
        return _read_run(path)
    except RunFileError as err:
        raise ReviewError(str(err)) from err


def _read_run(path: Path) -> Run:
    config = read_mapping(path / "resolved_config.yaml")
    # Schema and Hydra-internal groups say nothing about the pipeline itself.
    choices = {
        k: v for k, v in read_choices(path).items() if not k.startswith(("schema/", "hydra/"))
    }
    overrides = read_overrides(path)
    # A folder without metrics.json is a run that was killed before it could write one.
    metrics = read_metrics(path)
    generations_path = path / "generations.jsonl"
    if not generations_path.is_file():
        why = f" (its metrics.json says {metrics.get('status')}" if metrics is not None else ""
        if why and metrics and metrics.get("error"):
            why += ": " + " ".join(str(metrics["error"]).split())  # one line on stderr
        raise ReviewError(f"{path} has no generations.jsonl{why + ')' if why else ''}")
    metrics = {"status": RunStatus.INTERRUPTED} if metrics is None else metrics
    generations = read_generations(generations_path)
    ids = Counter(g["id"] for g in generations)
    repeated = next((rid for rid, count in ids.items() if count > 1), None)
    if repeated is not None:
        raise ReviewError(
            f"{generations_path}: id {repeated!r} is on {ids[repeated]} lines, and the review "
            "matches requests by id: serve the run again (this version gives every request "
            "its own id)"
        )
    return Run(path, config, choices, overrides, metrics, generations)


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
    return {"changed": dict(sorted(changed.items())), "added": added, "removed": removed}


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


def metrics_table(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each metric of either run: A, B, B - A and B / A (None where it does not apply)."""
    flat_a, flat_b = _numbers(a), _numbers(b)
    rows: dict[str, dict[str, Any]] = {}
    for key in [*flat_a, *(k for k in flat_b if k not in flat_a)]:
        va, vb = flat_a.get(key), flat_b.get(key)
        row: dict[str, Any] = {"a": va, "b": vb, "delta": None, "ratio": None}
        if _is_number(va) and _is_number(vb):
            row["delta"] = vb - va
            row["ratio"] = vb / va if va else None
        rows[key] = row
    return rows


# --------------------------------------------------------------------------- outputs


def _decoder(run: Run):
    """The run's own tokenizer when it can be built here; otherwise token ids are shown."""
    node = run.config.get("tokenizer")
    if not isinstance(node, dict) or "_target_" not in node:
        return None
    try:
        from hydra.utils import instantiate

        return instantiate(node).decode
    except Exception:  # e.g. a tokenizer.path that exists only on the machine that ran it
        return None


def _show(decode, ids: Sequence[int]) -> str:
    if decode is None:
        return str(list(ids))
    return repr(decode(list(ids)))  # repr: control bytes and trailing spaces stay visible


def _workload_difference(a: Run, b: Run) -> str | None:
    """Why the two runs did not serve the same requests, or None. An unfinished run (killed
    or interrupted) may lack requests; the ones both have must still be the same."""
    if workload_digest(a.generations) == workload_digest(b.generations):
        return None
    gen_a = {g.get("id"): g for g in a.generations}
    gen_b = {g.get("id"): g for g in b.generations}
    for rid in gen_a.keys() & gen_b.keys():
        ka, kb = request_key(gen_a[rid]), request_key(gen_b[rid])
        if None in (ka["max_new_tokens"], kb["max_new_tokens"]):  # a folder from before limits
            ka["max_new_tokens"] = kb["max_new_tokens"] = None
        if ka != kb:
            return f"the runs serve different workloads (request {rid} differs)"
    if a.complete and b.complete:
        return (
            f"the runs serve different workloads ({len(gen_a)} vs {len(gen_b)} requests, "
            f"{len(gen_a.keys() & gen_b.keys())} in common)"
        )
    return None


def outputs_verdict(a: Run, b: Run) -> dict[str, Any]:
    """Compares the generated tokens request by request, matched by id."""
    reason = _workload_difference(a, b)
    gen_a = {g["id"]: g for g in a.generations}
    gen_b = {g["id"]: g for g in b.generations}
    if reason is not None:
        return {"comparable": False, "reason": reason}

    decode = _decoder(a)
    ids = [*gen_a, *(i for i in gen_b if i not in gen_a)]
    differences = []
    for rid in ids:
        if rid not in gen_a or rid not in gen_b:
            only = "B" if rid not in gen_a else "A"
            differences.append({"id": rid, "position": None, "note": f"only in {only}"})
            continue
        ta, tb = gen_a[rid].get("output_ids") or [], gen_b[rid].get("output_ids") or []
        if ta == tb:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
        pos = min(len(ta), len(tb)) if pos is None else pos  # one is a prefix of the other
        differences.append(
            {
                "id": rid,
                "position": pos,
                "lengths": {"a": len(ta), "b": len(tb)},
                "context": _show(decode, ta[max(0, pos - CONTEXT_TOKENS) : pos]),
                "a": _show(decode, ta[pos : pos + CONTINUATION_TOKENS]),
                "b": _show(decode, tb[pos : pos + CONTINUATION_TOKENS]),
                "errors": {"a": gen_a[rid].get("error"), "b": gen_b[rid].get("error")},
            }
        )
    total = len(ids)
    return {
        "comparable": True,
        "total": total,
        "identical": total - len(differences),
        "differences": differences,
    }


def verdict_line(verdict: dict[str, Any]) -> str:
    if not verdict["comparable"]:
        return f"outputs not comparable: {verdict['reason']}"
    n, total = verdict["identical"], verdict["total"]
    if n == total:
        return f"identical tokens for {n}/{total} requests"
    return f"tokens differ for {total - n}/{total} requests ({n}/{total} identical)"


# ---------------------------------------------------------------------------- report


def review(a: Run, b: Run) -> dict[str, Any]:
    """The whole review of B against A as one JSON-ready document."""
    return {
        "a": str(a.path),
        "b": str(b.path),
        "config": {
            **config_diff(a.config, b.config),
            "choices": {"a": a.choices, "b": b.choices},
            "overrides": {"a": a.overrides, "b": b.overrides},
        },
        "metrics": metrics_table(a.metrics, b.metrics),
        "outputs": outputs_verdict(a, b),
    }


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
    out += _render_config(doc["config"])
    out += ["", "== Metrics (metrics.json) =="]
    rows = [
        [k, _cell(r["a"]), _cell(r["b"]), _cell(r["delta"]), _ratio(r["ratio"])]
        for k, r in doc["metrics"].items()
    ]
    out += _table(["metric", "A", "B", "B - A", "B / A"], rows) if rows else ["  no metrics"]
    out += trap_notes(doc["metrics"])
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
        if metrics.get("slo_met", {}).get(side) is False:
            attained = metrics.get("slo_attainment", {}).get(side)
            target = metrics.get("slo.attainment", {}).get(side)
            out.append(f"  note: {side.upper()} missed its SLO ({_cell(attained)} < {target})")
    return out


def _render_config(cfg: dict[str, Any]) -> list[str]:
    out = ["== Config (resolved_config.yaml) =="]
    if not (cfg["changed"] or cfg["added"] or cfg["removed"]):
        out.append("  no differences")
    if cfg["changed"]:
        out.append("changed:")
        out += [
            f"  {k}: {v['a']!r} -> {v['b']!r}" + (f"  ({v['note']})" if v.get("note") else "")
            for k, v in cfg["changed"].items()
        ]
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


def exit_code(doc: dict[str, Any], fail_on_output_diff: bool) -> int:
    outputs = doc["outputs"]
    if not outputs["comparable"]:
        return EXIT_OUTPUT_DIFF if fail_on_output_diff else EXIT_BAD_INPUT
    if fail_on_output_diff and outputs["differences"]:
        return EXIT_OUTPUT_DIFF
    return EXIT_OK


# ------------------------------------------------------------------------------- CLI


def _review_pair(a_path: Path, b_path: Path) -> dict[str, Any]:
    return review(load_run(a_path), load_run(b_path))


def _sweep_pairs(sweep_dir: Path, baseline: int) -> tuple[Path, list[tuple[int, Path]]]:
    """The baseline job's folder and every other job's (number, folder)."""
    if not sweep_dir.is_dir():
        raise ReviewError(f"{sweep_dir}: no such folder")
    jobs = find_jobs(sweep_dir)
    if not jobs:
        if (sweep_dir / "resolved_config.yaml").is_file():
            raise ReviewError(
                f"{sweep_dir} is a single run, not a sweep folder: give a second run to review"
            )
        raise ReviewError(f"{sweep_dir} is not a sweep folder: no job holds .hydra/overrides.yaml")
    by_num = {j.num: j.path for j in jobs}
    if baseline not in by_num:
        known = ", ".join(str(n) for n in sorted(by_num))
        raise ReviewError(f"{sweep_dir} has no job {baseline} (its jobs: {known})")
    return by_num[baseline], [(j.num, j.path) for j in jobs if j.num != baseline]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.review",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python -m pipeline.review outputs/A outputs/B --fail-on-output-diff",
    )
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="RUN_A RUN_B, or SWEEP")
    parser.add_argument(
        "--baseline", type=int, metavar="K", help="with a sweep folder: review every job against K"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--fail-on-output-diff",
        action="store_true",
        help="exit 1 when the generated tokens differ (or cannot be compared)",
    )
    args = parser.parse_args(argv)

    try:
        if len(args.runs) == 2 and args.baseline is None:
            doc = _review_pair(*args.runs)
            print(json.dumps(doc, indent=2, default=str) if args.json else render(doc))
            code = exit_code(doc, args.fail_on_output_diff)
            if not doc["outputs"]["comparable"]:
                print(f"Error: {verdict_line(doc['outputs'])}", file=sys.stderr)
            return code
        if len(args.runs) == 1:
            return _main_sweep(args.runs[0], args.baseline or 0, args)
        raise ReviewError("give two run folders (RUN_A RUN_B), or one sweep folder --baseline K")
    except ReviewError as err:
        print(f"Error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _main_sweep(sweep_dir: Path, baseline: int, args: argparse.Namespace) -> int:
    """Reviews every job against the baseline; a job that cannot be reviewed is reported and
    skipped, and the exit code is the worst of all the jobs'."""
    base_path, others = _sweep_pairs(sweep_dir, baseline)
    base = load_run(base_path)
    docs: list[dict[str, Any]] = []
    code = EXIT_OK
    for num, path in others:
        try:
            doc = {"job": num, **review(base, load_run(path))}
        except ReviewError as err:
            print(f"Error: job {num}: {err}", file=sys.stderr)
            docs.append({"job": num, "b": str(path), "error": str(err)})
            code = max(code, EXIT_BAD_INPUT)
            continue
        docs.append(doc)
        code = max(code, exit_code(doc, args.fail_on_output_diff))
        if not doc["outputs"]["comparable"]:
            print(f"Error: job {num}: {verdict_line(doc['outputs'])}", file=sys.stderr)
        if not args.json:
            print(f"##### job {num} against job {baseline}\n{render(doc)}\n")
    if args.json:
        print(json.dumps({"baseline": baseline, "reviews": docs}, indent=2, default=str))
    else:
        print(f"##### verdicts against job {baseline} ({base_path})")
        for doc in docs:
            if "error" in doc:
                print(f"  job {doc['job']}: {doc['error']}")
                continue
            # The job's own overrides that the baseline does not share: what the job varies.
            own = [
                o for o in doc["config"]["overrides"]["b"] or [] if o not in (base.overrides or [])
            ]
            print(
                f"  job {doc['job']} ({' '.join(own) or 'same overrides'}): "
                f"{verdict_line(doc['outputs'])}"
            )
    return code
