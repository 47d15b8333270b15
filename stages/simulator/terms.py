"""The terms of a step's cost: each a roofline, max(FLOPs / achieved FLOP rate, bytes /
achieved bandwidth), of the amounts a step computes and moves (stages.simulator.step_work),
on a device's figures; the cost model (stages.simulator.cost_model) weighs them by their
coefficients."""

from __future__ import annotations

from typing import Any

import numpy as np

from stages.simulator.hardware import HardwareProfile
from stages.simulator.moe_layer import fixed_seconds
from stages.simulator.step_work import StepAmounts

TERMS = (
    "linear",
    "prefill_attention",
    "decode_attention",
    "kv_write",
    "lm_head",
    "allreduce",
    "allreduce_latency",
    "kv_blocks",
    "alltoall",
    "alltoall_latency",
    "moe_fixed",
)
OVERHEAD = "overhead"
# The cost of handling one KV block in one layer (its index, gather and mask rows) beyond
# its bytes, before its coefficient; it tells small blocks from large ones. A device's
# profile sets its coefficient by calibration; uncalibrated it is 0 (the bytes alone).
BLOCK_S = 1e-6
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP
UNCALIBRATED = {"kv_blocks": 0.0}
RECOMPILE = "recompile"


def _roof(a: Any, b: Any) -> Any:
    """The larger of two times, each a number or an array (numpy's maximum is slow on
    plain numbers, and a simulated device asks for one step's terms at every step)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def _hidden(transfer: Any, compute: Any, split: Any) -> Any:
    """The all-reduce time a batch split in `split` parts hides: its parts pipeline, each
    part's all-reduce running under the next part's layer compute, so all but 1 / split of
    the shorter of the two."""
    if not isinstance(split, np.ndarray) and split == 1:
        return 0.0
    return (1 - 1 / np.asarray(split)) * np.minimum(transfer, compute)


def term_seconds(
    a: StepAmounts, hw: HardwareProfile, fp8: bool = False, tp: int = 1, ep: int = 1
) -> dict[str, Any]:
    """Each term's roofline seconds on `hw` (numbers, or arrays for stacked amounts). A GEMM
    of F FLOPs takes F / rate + the fixed fill time: summed over a step's GEMMs, the FLOPs
    at the rate plus one fill per kernel."""
    gemm, attn = hw.gemm_flops_per_s(fp8), hw.attention_flops_per_s
    mem, link = hw.memory_bytes_per_s, hw.interconnect_bytes_per_s(tp)
    linear = _roof(a.linear_flops / gemm + a.gemms * hw.gemm_fill_s, a.linear_bytes / mem)
    prefill = _roof(a.prefill_attention_flops / attn, a.prefill_kv_bytes / mem)
    transfer = a.allreduce_bytes / link
    return {
        "linear": linear,
        "prefill_attention": prefill,
        "decode_attention": _roof(a.decode_attention_flops / attn, a.decode_kv_bytes / mem),
        "kv_write": a.kv_write_bytes / mem,
        # The lm head stays in the model's dtype: the bf16 rate.
        "lm_head": _roof(a.lm_head_flops / hw.gemm_flops_per_s(), a.lm_head_bytes / mem),
        "allreduce": transfer - _hidden(transfer, linear + prefill, a.batch_split),
        "allreduce_latency": a.allreduce_calls * hw.allreduce_latency_s,
        "kv_blocks": a.kv_blocks_s,
        # Expert parallelism's dispatches and combines over the links to ep - 1 peers.
        "alltoall": a.alltoall_bytes / hw.interconnect_bytes_per_s(ep),
        "alltoall_latency": a.alltoall_calls * hw.allreduce_latency_s,
        # The MoE layers' grouped GEMMs: a fixed time per layer and per expert they run.
        "moe_fixed": fixed_seconds(a.moe_layers, a.moe_experts, hw.moe_layer_s, hw.moe_expert_s),
    }
