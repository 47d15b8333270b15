"""Bucket plans for speed on three workloads, ERNIE-4.5-21B-A3B on a simulated Gaudi 2.

    python -m benchmarks.bucket_plan [--out benchmarks/bucket_plan.md] [--work DIR]

Each workload is planned with `python -m pipeline.buckets plan --workload ...
--max-shapes exponential` (no more graphs than the exponential set): candidate sets are
served on the workload beside the linear and exponential ones, and the plan recommends a
set only where it is no slower than the reference built-in with no more graphs. The
table gives each workload's recommended set, the exponential and the linear one as
served (choice.json of each plan). The workloads:

- chat trace: an Azure-conversation-shaped trace (benchmarks/azure_conversation.py,
  2,300 requests over an hour) at 10x speed, a little past what the device keeps up with;
- long prompts: 300 prompts of 2,000-7,000 tokens, 32-256 new tokens, 1.5 requests/s;
- prefix sharing: 400 prompts after one of 4 shared 1,536-token prefixes, 6 requests/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks.azure_conversation import write_conversation_trace
from pipeline.buckets import plan_source, simulated_run, workload_variants

MODEL = ["executor=simulated", "hardware=gaudi2", "model=spec/ernie45_21b_a3b", "max_tokens=2048"]


def workloads(tmp: Path) -> dict[str, list[str]]:
    tmp.mkdir(parents=True, exist_ok=True)
    trace = tmp / "conversation.csv"
    write_conversation_trace(trace, requests=2300, seconds=3600.0)
    synthetic = ["workload=synthetic", "workload.ignore_eos=true"]
    return {
        "chat trace": ["workload=trace", f"workload.path={trace}", "workload.time_scale=0.1",
                       "max_model_len=8192"],
        "long prompts": [*synthetic, "workload.num_requests=300", "workload.rate=1.5",
                         "workload.min_prompt_tokens=2000", "workload.max_prompt_tokens=7000",
                         "workload.min_new_tokens=32", "workload.max_new_tokens=256",
                         "max_model_len=8192"],
        "prefix sharing": [*synthetic, "workload.num_requests=400", "workload.rate=6",
                           "workload.shared_prefix_tokens=1536", "workload.num_prefixes=4",
                           "workload.min_prompt_tokens=16", "workload.max_prompt_tokens=800",
                           "workload.min_new_tokens=32", "workload.max_new_tokens=256",
                           "max_model_len=4096"],
    }  # fmt: skip


def plan(overrides: list[str], out: Path) -> dict:
    """Plans the workload within the exponential set's graphs; its choice.json."""
    source = simulated_run([*MODEL, *overrides], out / "simulated-run")
    plan_source(source, 0, out, "planned", 0.001, variants=workload_variants([*MODEL, *overrides]))
    return json.loads((out / "choice.json").read_text())


def rows(name: str, choice: dict) -> list[str]:
    by_set = {s["set"]: s for s in choice["sets"]}
    shown = [choice["recommended"], *(s for s in ("exponential", "linear") if s in by_set)]
    lines = []
    for label in dict.fromkeys(shown):
        s = by_set[label]
        role = "recommended" if label == choice["recommended"] else "built-in"
        lines.append(
            f"| {name} | {label} ({role}) | {s['graphs']:,} | {s['warmup_s'] / 3600:.2f} | "
            f"{s['throughput']:,.1f} | {s['ttft_p50_ms']:,.0f} / {s['ttft_p90_ms']:,.0f} | "
            f"{s['tpot_p50_ms']:.1f} / {s['tpot_p90_ms']:.1f} | {s['misses']} | "
            f"{s['compiles']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the table here (else print it)")
    parser.add_argument("--work", type=Path, help="keep the plans here (else a temp folder)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    lines = [
        f"# Bucket plans for speed (commit {commit}; ERNIE-4.5-21B-A3B, simulated Gaudi 2, "
        "max_tokens 2048, at most the exponential set's graphs)",
        "",
        "| workload | set | graphs | warmup h | output tok/s | TTFT p50 / p90 ms | "
        "TPOT p50 / p90 ms | misses | compiles while serving |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    reasons = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for i, (name, overrides) in enumerate(workloads(work).items()):
            choice = plan(overrides, work / str(i))
            lines += rows(name, choice)
            reasons.append(f"- {name}: {choice['reason']}.")
    text = "\n".join([*lines, "", *reasons, ""])
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
