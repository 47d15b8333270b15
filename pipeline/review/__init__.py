"""The config-diff review: what changed between two runs, what it did to the metrics, and
whether the generated tokens are still the same.

    python -m pipeline.review RUN_A RUN_B [--json] [--fail-on-output-diff]
    python -m pipeline.review SWEEP_DIR --baseline K
    python -m pipeline.review PLAN_JOB_A PLAN_JOB_B   (or PLAN_A PLAN_B: pipeline/review/plans.py)

Exit codes: 0 reviewed; 1 outputs differ (or are not comparable) with --fail-on-output-diff,
the CI gate; 2 bad input (not a run, no generations, runs on different workloads). Workloads are
compared by content (ids, prompts, limits), so a copied workload file is the same one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.command import ArgparseCommand, Failure
from pipeline.review import plans
from pipeline.review.compare import config_diff, metrics_table
from pipeline.review.outputs import outputs_verdict, verdict_line
from pipeline.review.render import render, trap_notes
from pipeline.review.runs import ReviewError, Run, load_run
from pipeline.summary import find_jobs

# The command, the review document, and the parts other modules and tests use.
__all__ = [
    "ReviewError",
    "Run",
    "config_diff",
    "load_run",
    "main",
    "metrics_table",
    "outputs_verdict",
    "review",
    "trap_notes",
]

EXIT_OK, EXIT_OUTPUT_DIFF, EXIT_BAD_INPUT = 0, 1, 2


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


def exit_code(doc: dict[str, Any], fail_on_output_diff: bool) -> int:
    outputs = doc["outputs"]
    if outputs.get("placeholders"):  # simulated runs: nothing to compare, nothing wrong
        return EXIT_OK
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


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def review_command(args: argparse.Namespace, argv: list[str]) -> int:
    if len(args.runs) == 2 and args.baseline is None and plans.handles(*args.runs):
        doc = plans.review_plan_pair(*args.runs)
        print(json.dumps(doc, indent=2, default=str) if args.json else plans.render_plans(doc))
        return EXIT_OK
    if len(args.runs) == 2 and args.baseline is None:
        doc = _review_pair(*args.runs)
        print(json.dumps(doc, indent=2, default=str) if args.json else render(doc))
        code = exit_code(doc, args.fail_on_output_diff)
        if code != EXIT_OK and not doc["outputs"]["comparable"]:
            print(f"Error: {verdict_line(doc['outputs'])}", file=sys.stderr)
        return code
    if len(args.runs) == 1:
        return _main_sweep(args.runs[0], args.baseline or 0, args)
    raise ReviewError("give two run folders (RUN_A RUN_B), or one sweep folder --baseline K")


COMMAND = ArgparseCommand(
    name="pipeline.review",
    parser=build_parser,
    run=review_command,
    failures=(Failure((ReviewError,), EXIT_BAD_INPUT),),
)


def main(argv: Sequence[str] | None = None) -> int:
    return COMMAND.main(argv)


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
        if not doc["outputs"]["comparable"] and not doc["outputs"].get("placeholders"):
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
