"""Planned bucket sets against the linear and exponential ones, served for real.

    python -m benchmarks.bucket_plan [--max-shapes 64] [--out benchmarks/bucket_plan.md]

On the workloads (the default synthetic one; `+experiment=long_prompts` with the tiny
model and fewer decode tokens; a jsonl workload of varied lengths generated here, at
block_size 128 and 16), each is
served once with the config's linear set, planned from those steps with at most
`--max-shapes` warmup shapes, then served with the planned set and with the exponential
one. Token utilization and bucket misses are each run's own (metrics as the engine
counts them); shape counts are what warmup would compile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import subprocess
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.buckets import plan_source
from pipeline.compose import compose_config
from pipeline.metrics import summarise
from pipeline.run import build_engine

WORDS = "the of and to in is for on with as by at from that this it be are was".split()


def jsonl_workload(path: Path, num_requests: int = 48, seed: int = 0) -> Path:
    """Prompts of 4 to 1400 bytes, most short, some long (a log-uniform spread), asking
    for 4 to 96 tokens."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(num_requests):
            length = int(round(4 * (350 ** rng.random())))
            text = ""
            while len(text) < length:
                text += rng.choice(WORDS) + " "
            line = {"id": f"r{i}", "prompt": text[:length], "max_new_tokens": rng.randint(4, 96)}
            out.write(json.dumps(line) + "\n")
    return path


def workloads(tmp: Path) -> dict[str, list[str]]:
    prompts = jsonl_workload(tmp / "prompts.jsonl")
    return {
        "synthetic (default)": [],
        "long_prompts": [
            "+experiment=long_prompts",
            "model=tiny",
            "max_tokens=256",
            "workload.parts.decode.min_new_tokens=96",
            "workload.parts.decode.max_new_tokens=128",
        ],
        "jsonl": ["workload=jsonl", f"workload.path={prompts}", "max_tokens=1024"],
        # the same at block_size 16: a finer seq axis, and a linear set of ~16,000 shapes
        "jsonl, block_size 16": [
            "workload=jsonl",
            f"workload.path={prompts}",
            "block_size=16",
            "max_tokens=1024",
        ],
    }


def serve(overrides: list[str], folder: Path | None = None) -> dict:
    """Serves in-process; with `folder`, leaves the files the planner reads there."""
    cfg = compose_config(overrides)
    engine, requests = build_engine(cfg)
    steps: list = []
    start = time.perf_counter()
    duration = engine.run(requests, on_step=steps.append)
    wall = time.perf_counter() - start
    if folder is not None:
        folder.mkdir(parents=True)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        resolved["num_blocks"] = engine.scheduler.kv_cache.num_blocks
        (folder / "resolved_config.yaml").write_text(OmegaConf.to_yaml(resolved))
        lines = "".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in steps)
        (folder / "steps.jsonl").write_text(lines)
    metrics = summarise(requests, steps, duration)
    counts = engine.warmup_counts()
    return {
        "utilization": metrics["token_utilization"],
        "misses": engine.metadata.bucket_misses,
        "shapes": sum(counts.values()),
        "steps": len(steps),
        "errors": metrics["num_errors"],
        "outputs": {r.id: r.output_ids for r in requests},
        "wall_s": wall,
    }


def compare(
    index: int, name: str, overrides: list[str], tmp: Path, max_shapes: int, block_weight: float
) -> list[str]:
    run = tmp / str(index) / "run"
    linear = serve(overrides, run)
    plan, predicted = plan_source(run, max_shapes, run.parent / "plan", "planned", block_weight)
    planned = serve(
        [*overrides, f"hydra.searchpath=[file://{run.parent / 'plan'}]", "+buckets=planned"]
    )
    exponential = serve([*overrides, "metadata.bucketing=exponential"])
    same = all(r["outputs"] == linear["outputs"] for r in (planned, exponential))
    rows = []
    for label, r in (("plan", planned), ("linear", linear), ("exponential", exponential)):
        rows.append(
            f"| {name} | {label} | {r['shapes']} | {r['utilization']:.3f} | {r['misses']} | "
            f"{r['steps']} | {r['errors']} | {r['wall_s']:.1f} |"
        )
    sizes = "; ".join(f"{axis} {values}" for axis, values in plan.sizes.items())
    rows.append(
        f"| {name} | planned sizes | {sizes} (predicted utilization "
        f"{predicted['plan'].utilization:.3f}); same tokens in all three: {same} | | | | | |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-shapes", type=int, default=64)
    parser.add_argument("--block-weight", type=float, default=0.001)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"# Bucket plans (commit {commit}, at most {args.max_shapes} shapes, block weight "
        f"{args.block_weight})",
        "",
        "| workload | set | warmup shapes | token utilization | misses | steps | errors "
        "| serve s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(workloads(Path(tmp)).items()):
            lines += compare(i, name, overrides, Path(tmp), args.max_shapes, args.block_weight)
            print("\n".join(lines[-4:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
