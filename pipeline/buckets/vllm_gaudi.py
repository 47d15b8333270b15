"""A bucket plan for a vllm-gaudi run (engine=vllm on Gaudi): the recommended set as the
VLLM_BUCKETING_FROM_FILE file vllm-gaudi reads, in its own axes, checked against the
filters vllm-gaudi applies to it (its `generate_buckets`, as docs/features/
bucketing_mechanism.md of vllm-project/vllm-gaudi describes it: a prompt bucket whose
batch x query exceeds max_num_batched_tokens is dropped; a fresh prompt has context 0 and
pads to the least context listed)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from pipeline.run_folder.reader import RESOLVED_CONFIG, read_mapping
from stages.forward.buckets import Bucketing

VLLM_STRATEGIES = (Bucketing.vllm_lin, Bucketing.vllm_exp, Bucketing.vllm_pad)


def vllm_strategy(run: Path) -> Bucketing | None:
    """The vllm-gaudi strategy the run simulated (engine=vllm on Gaudi), or None."""
    meta = (read_mapping(run / RESOLVED_CONFIG) or {}).get("metadata") or {}
    strategy = str(meta.get("bucketing", ""))
    return Bucketing(strategy) if strategy in {s.value for s in VLLM_STRATEGIES} else None


def file_buckets(text: str) -> list[tuple[int, ...]]:
    """The buckets of a VLLM_BUCKETING_FROM_FILE file as vllm-gaudi reads it: each line a
    tuple whose list positions multiply out."""
    out: list[tuple[int, ...]] = []
    for line in text.splitlines():
        dims = [d if isinstance(d, list) else [d] for d in ast.literal_eval(line)]
        out += list(itertools.product(*dims))
    return out


def export_lines(served: Path, deploy: Path) -> list[str]:
    """Writes the served plan's vllm-gaudi script and bucket file into `deploy`; the
    report's lines on the file: its buckets, and the filters they pass."""
    from pipeline.deploy import VLLM_BUCKETS, export_run

    export_run(served, deploy)
    config = read_mapping(served / RESOLVED_CONFIG) or {}
    budget = int(config["max_tokens"])
    buckets = file_buckets((deploy / VLLM_BUCKETS).read_text(encoding="utf-8"))
    prompts = [b for b in buckets if b[1] > 1]
    dropped = [b for b in prompts if b[0] * b[1] > budget]
    fresh = {q for _, q, c in prompts if c == 0}
    without_fresh = sorted({q for _, q, _ in prompts} - fresh)
    if dropped or without_fresh:  # the file is written to pass both: a broken export
        raise AssertionError(f"vllm-gaudi would drop {dropped} or pad queries {without_fresh}")
    return [
        "## For vllm-gaudi",
        "",
        f"`{deploy / 'vllm-gaudi.sh'}` serves the recommended set from "
        f"VLLM_BUCKETING_FROM_FILE=`{deploy / VLLM_BUCKETS}`, in vllm-gaudi's axes: "
        f"{len(prompts):,} prompt buckets (batch, query tokens, context blocks), every query "
        f"size with context 0 for a fresh prompt, none with batch x query past "
        f"--max-num-batched-tokens {budget:,} (vllm-gaudi drops those); "
        f"{len(buckets) - len(prompts):,} decode buckets (batch, 1, blocks).",
        "",
    ]
