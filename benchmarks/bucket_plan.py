"""Bucket plans for speed on three workloads, ERNIE-4.5-21B-A3B on a simulated Gaudi 2, in
each engine's own terms: before (the engine's default shapes) and after (the plan's).

    python -m benchmarks.bucket_plan [--engines fastdeploy,vllm,native]
        [--out benchmarks/bucket_plan.md] [--work DIR]

Each workload is served with engine=E on the simulated device (the `before` run: the
engine's defaults), then planned with `python -m pipeline.buckets plan` within that run's
own graphs (--max-shapes = its warmup count; native: `exponential`): for
engine=fastdeploy FastDeploy's step variables and HPU_WARMUP_MODEL_LEN
(pipeline/buckets/fastdeploy.py), for engine=vllm a
bucket set served against vllm-gaudi's default `exp` strategy and our built-in sets and
exported as VLLM_BUCKETING_FROM_FILE, for engine=native a bucket set against our linear
and exponential sets. `after` is the recommendation served on the same workload. The
workloads:

- chat trace: an Azure-conversation-shaped trace (benchmarks/azure_conversation.py,
  2,300 requests over an hour) at 10x speed, a little past what the native engine keeps
  up with (past what FastDeploy's prefill cap of 3 does: its queue grows);
- long prompts: 300 prompts of 2,000-7,000 tokens, 32-256 new tokens, 1.5 requests/s;
- prefix sharing: 400 prompts after one of 4 shared 1,536-token prefixes, 6 requests/s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.azure_conversation import write_conversation_trace
from pipeline.buckets import plan_source, simulated_run, workload_variants
from pipeline.buckets.fastdeploy import plan_fastdeploy

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


def plan(engine: str, overrides: list[str], out: Path) -> tuple[dict, dict, str]:
    """The engine's default run's metrics, the served recommendation's, and its label."""
    config = [*MODEL, f"engine={engine}", *overrides]
    source = simulated_run(config, out / "simulated-run")
    before = json.loads((source / "metrics.json").read_text())
    # no more graphs than the engine's defaults (native: than our exponential set, as ever)
    budget = int(before["warmup_shapes"]) if engine != "native" else 0
    variants = workload_variants(config)
    if engine == "fastdeploy":
        label = plan_fastdeploy(source, source, variants, out, "planned", budget)["recommended"]
    else:
        plan_source(source, budget, out, "planned", 0.001, variants=variants)
        label = json.loads((out / "choice.json").read_text())["recommended"]
    after = json.loads((out / "served-same" / "metrics.json").read_text())
    return before, after, label


def row(name: str, engine: str, when: str, label: str, m: dict) -> str:
    def p90(key: str) -> float:
        return float((m.get(key) or {}).get("p90") or 0.0)

    warmup = float(m.get("predicted_warmup_s") or m.get("warmup_s") or 0.0)
    return (
        f"| {name} | {engine} | {when}: {label} | {m['output_throughput']:,.1f} | "
        f"{p90('ttft_ms'):,.0f} | {p90('tpot_ms'):.1f} | {m['warmup_shapes']:,} | "
        f"{warmup / 3600:.2f} | {m['serving_compiles']:,} |"
    )


DEFAULTS = {"fastdeploy": "FastDeploy's defaults", "vllm": "vllm-gaudi exp",
            "native": "linear"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", default="fastdeploy,vllm,native", help="comma-separated")
    parser.add_argument("--out", type=Path, help="write the table here (else print it)")
    parser.add_argument("--work", type=Path, help="keep the plans here (else a temp folder)")
    args = parser.parse_args()
    lines = [
        "# Bucket plans in each engine's terms (ERNIE-4.5-21B-A3B, simulated Gaudi 2, "
        "max_tokens 2048)",
        "",
        f"Made by `python -m benchmarks.bucket_plan --engines {args.engines} "
        "--out benchmarks/bucket_plan.md`.",
        "",
        "| workload | engine | set | output tok/s | TTFT p90 ms | TPOT p90 ms | graphs | "
        "warmup h | compiles while serving |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for i, (name, overrides) in enumerate(workloads(work).items()):
            for engine in args.engines.split(","):
                before, after, label = plan(engine, overrides, work / f"{i}-{engine}")
                lines += [row(name, engine, "before", DEFAULTS[engine], before),
                          row(name, engine, "after", label, after)]  # fmt: skip
    text = "\n".join([*lines, ""])
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
