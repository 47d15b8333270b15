"""The grouped GEMMs of one MoE layer against measured kernel times: fits the device
profile's `moe_layer_s` and `moe_expert_s` (stages/simulator/moe_layer.py) on one model's
rows and reports the other's, held out.

    python -m benchmarks.moe_kernels [--file CSV] [--hardware h100]

The file is pipeline/calibrate/data/published-moe-kernels.csv: vLLM's benchmark_moe.py on an
H100 (github.com/vllm-project/vllm/pull/24700), Qwen3-30B-A3B in FP8 (128 experts, top 8,
experts 768 wide) and Mixtral-8x7B in bf16 at tp 2 (8 experts, top 2, 7168 wide a device).
A row's predicted time is the roofline of its FLOPs and the weights of the experts its
tokens touch (the profile's GEMM rate and bandwidth, unchanged) plus moe_layer_s plus
moe_expert_s per touched expert. Fitted: Qwen3's rows up to FIT_BATCH tokens, where the
experts' reads bound the layer; held out: Mixtral's. Beyond FIT_BATCH the grouped GEMMs are
compute-bound, and their printed errors say how far a dense GEMM's fitted rate is from them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from stages.model.spec import MoeLayout
from stages.simulator.hardware import HardwareProfile
from stages.simulator.moe_layer import experts_touched
from stages.simulator.nnls import nnls

DATA = Path(__file__).resolve().parents[1] / "pipeline/calibrate/data/published-moe-kernels.csv"
FIT_MODEL = "Qwen3-30B-A3B"
FIT_BATCH = 128  # tokens a layer: up to here the experts' weights bound it


@dataclass(frozen=True)
class KernelRow:
    model: str
    tp: int  # the experts split over tp devices: `inter` is a device's share
    fp8: bool
    moe: MoeLayout
    hidden: int
    batch: int
    seconds: float


def read_rows(path: str | Path) -> list[KernelRow]:
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        moe = MoeLayout(
            int(r["num_experts"]), int(r["experts_per_token"]), int(r["inter"]), 0, frozenset({0})
        )
        fp8 = r["dtype"] == "fp8"
        seconds = 1e-6 * float(r["kernel_us"])
        shape = (int(r["hidden"]), int(r["batch"]), seconds)
        rows.append(KernelRow(r["model"], int(r["tp"]), fp8, moe, *shape))
    return rows


def roofline_and_experts(row: KernelRow, hw: HardwareProfile) -> tuple[float, float]:
    """The row's roofline seconds (its pairs' FLOPs at the GEMM rate, its touched experts'
    weights at the bandwidth) and its touched experts, each counted as the share of it a
    device runs (1 / tp)."""
    params = 3 * row.hidden * row.moe.expert_intermediate_size
    touched = float(experts_touched(row.moe, row.batch))
    flops = 2.0 * row.batch * row.moe.experts_per_token * params
    weight_bytes = touched * params * (1 if row.fp8 else 2)
    seconds = max(flops / hw.gemm_flops_per_s(fp8=row.fp8), weight_bytes / hw.memory_bytes_per_s)
    return seconds, touched / row.tp


def fit(rows: list[KernelRow], hw: HardwareProfile) -> tuple[float, float]:
    """moe_layer_s and moe_expert_s (>= 0) that best explain `rows` beside their rooflines,
    each row weighed by 1 / its time (relative errors)."""
    parts = [roofline_and_experts(r, hw) for r in rows]
    weight = np.array([1.0 / r.seconds for r in rows])
    # In microseconds and per 100 experts: columns of like size for the solver.
    design = np.array([[1e-6, 1e-4 * touched] for _, touched in parts]) * weight[:, None]
    rest = np.array([r.seconds - roof for r, (roof, _) in zip(rows, parts, strict=True)]) * weight
    layer_us, expert_us = nnls(design, rest)
    return 1e-6 * float(layer_us), 1e-4 * float(expert_us)


def errors(
    rows: list[KernelRow], hw: HardwareProfile, layer_s: float, expert_s: float
) -> list[float]:
    out = []
    for row in rows:
        roof, touched = roofline_and_experts(row, hw)
        out.append((roof + layer_s + expert_s * touched) / row.seconds - 1)
    return out


def summary(label: str, values: list[float]) -> str:
    magnitudes = [abs(e) for e in values]
    middle, worst = statistics.median(magnitudes), max(magnitudes)
    return f"{label}: {len(values)} rows, median {middle:.1%}, worst {worst:.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DATA))
    parser.add_argument("--hardware", default="h100")
    args = parser.parse_args(argv)
    hw = build(compose_config([f"hardware={args.hardware}", "executor=simulated"]).hardware)
    rows = read_rows(args.file)
    small = [r for r in rows if r.batch <= FIT_BATCH]
    fitted = [r for r in small if r.model == FIT_MODEL]
    held = [r for r in small if r.model != FIT_MODEL]
    layer_s, expert_s = fit(fitted, hw)
    print(
        f"fitted on {FIT_MODEL} up to {FIT_BATCH} tokens: moe_layer_s {layer_s:.4g}, "
        f"moe_expert_s {expert_s:.4g}"
    )
    for row, err in zip(rows, errors(rows, hw, layer_s, expert_s), strict=True):
        part = "fit" if row in fitted else "held out" if row in held else "compute-bound"
        us = row.seconds * 1e6
        print(f"  {row.model:<28} {row.batch:>5} tokens: {us:8.1f} us, {err:+7.1%} ({part})")
    print(summary("fit", errors(fitted, hw, layer_s, expert_s)))
    print(summary("held out", errors(held, hw, layer_s, expert_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
