"""Schemas of the `hardware` options: a device profile's figures, given in full
(conf/hardware/*.yaml) or read from a measured profile file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class HardwareConf:
    """A device's public figures and the cost model's (uncalibrated) factors."""

    _target_: str = "stages.simulator.hardware.HardwareProfile"
    name: str = MISSING
    bf16_tflops: float = MISSING  # dense peak
    hbm_bandwidth_gbs: float = MISSING
    hbm_capacity_gib: float = MISSING
    interconnect_gbs: float = MISSING  # per device, one direction
    gemm_efficiency: float = MISSING
    attention_efficiency: float = MISSING
    memory_efficiency: float = MISSING
    interconnect_efficiency: float = MISSING
    step_overhead_s: float = MISSING
    compile_s: float = MISSING  # one bucket's graph at warmup
    recompile_s: float = MISSING  # a bucket miss
    graph_memory_gib: float = MISSING
    kv_headroom: float = 0.1
    pads_to_buckets: bool = True
    fp8_tflops: float = 0.0  # dense FP8 peak; 0 = none (FP8 GEMMs at the bf16 rate)
    allreduce_latency_s: float = 0.0  # one all-reduce call's fixed time
    gemm_fill_s: float = 0.0  # one GEMM kernel's fixed time (thin GEMMs lose efficiency)
    interconnect_peer_gbs: float = 0.0  # all-to-all links: to one peer; 0 = a switch
    kv_link_gbs: float = 0.0  # disagg: KV transfer link per device, GB/s; 0 = no figure
    kv_link_latency_s: float = 0.0  # disagg: one KV transfer's fixed time
    kv_link_piece_s: float = 0.0  # disagg: one KV piece's (a block of a layer) posting time
    moe_layer_s: float = 0.0  # a MoE layer's grouped GEMMs: fixed time per layer
    moe_expert_s: float = 0.0  # ... and per expert they run
    draft_pass_s: float = 0.0  # an EAGLE head's pass: its fixed time beside its roofline
    coefficients: dict[str, float] = field(default_factory=dict)  # fitted; empty = defaults
    software: str = ""  # the software release the fitted figures describe
    # relative prediction errors by method (offline, static, online): fit_median, fit_worst,
    # held_out_median, held_out_worst (a split-half fit's held-out rows); plan bands read them
    errors: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class MeasuredHardwareConf:
    _target_: str = "pipeline.profiles.measured_profile"
    path: str = MISSING  # a profile YAML written by CostModel.write_profile


def schema_defaults(conf: type) -> dict[str, Any]:
    """The values a schema gives its keys by default: those set to a plain value (not
    MISSING, not an interpolation of another key), `_target_` left out."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(conf):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name == "_target_" or value is dataclasses.MISSING or value == MISSING:
            continue
        if not (isinstance(value, str) and value.startswith("${")):
            values[f.name] = value
    return values


SCHEMAS: dict[tuple[str, str], type] = {
    ("hardware", "device"): HardwareConf,
    ("hardware", "measured"): MeasuredHardwareConf,
}
