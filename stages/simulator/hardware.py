"""Hardware profiles of a simulated device, their YAML files, and the KV pool they leave.

Peak rates, memory and interconnect come from public spec sheets (cited in conf/hardware/);
the efficiency factors, overheads and compile times are guesses until a profile is fitted to
measured steps (`CostModel.fit`) and written with `write_profile`, which `hardware=measured
hardware.path=FILE` reads back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stages.model_spec import ModelSpec

GIB = 1024**3


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    bf16_tflops: float  # dense peak, no sparsity
    hbm_bandwidth_gbs: float  # GB/s, 1e9 bytes
    hbm_capacity_gib: float
    interconnect_gbs: float  # per device, one direction, for tensor-parallel all-reduces
    gemm_efficiency: float  # achieved fraction of peak FLOPs in GEMMs
    attention_efficiency: float  # ... in attention's QK and PV
    memory_efficiency: float  # achieved fraction of HBM bandwidth
    interconnect_efficiency: float  # achieved fraction of the interconnect's bandwidth
    step_overhead_s: float  # host time of one step: scheduling, launch, sampling
    compile_s: float  # graph compile of one bucket at warmup
    recompile_s: float  # a step whose bucket was not warmed compiles it first
    graph_memory_gib: float  # device memory the compiled graphs and workspaces reserve
    kv_headroom: float = 0.1  # fraction of capacity kept free beside weights and KV
    pads_to_buckets: bool = True  # HPU: computes the padded bucket; GPU: the real tokens
    coefficients: Mapping[str, float] = field(default_factory=dict)  # fitted; empty = 1.0

    def __post_init__(self) -> None:
        for key in ("bf16_tflops", "hbm_bandwidth_gbs", "hbm_capacity_gib", "interconnect_gbs"):
            if not getattr(self, key) > 0:
                raise ValueError(f"hardware.{key}={getattr(self, key)} must be > 0")
        for key in (
            "gemm_efficiency",
            "attention_efficiency",
            "memory_efficiency",
            "interconnect_efficiency",
        ):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"hardware.{key}={getattr(self, key)} must be in (0, 1]")
        for key in ("step_overhead_s", "compile_s", "recompile_s", "graph_memory_gib"):
            if getattr(self, key) < 0:
                raise ValueError(f"hardware.{key}={getattr(self, key)} must be >= 0")
        if not 0 <= self.kv_headroom < 1:
            raise ValueError(f"hardware.kv_headroom={self.kv_headroom} must be in [0, 1)")
        coefficients = {str(k): float(v) for k, v in dict(self.coefficients).items()}
        if any(v < 0 for v in coefficients.values()):
            raise ValueError(f"hardware.coefficients={coefficients} must all be >= 0")
        object.__setattr__(self, "coefficients", coefficients)

    @property
    def gemm_flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12 * self.gemm_efficiency

    @property
    def attention_flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12 * self.attention_efficiency

    @property
    def memory_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbs * 1e9 * self.memory_efficiency

    @property
    def interconnect_bytes_per_s(self) -> float:
        return self.interconnect_gbs * 1e9 * self.interconnect_efficiency


def kv_pool_blocks(spec: ModelSpec, hardware: HardwareProfile, block_size: int, tp: int) -> int:
    """KV blocks that fit one device: capacity less weights, graph memory and headroom."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    capacity = hardware.hbm_capacity_gib * GIB
    weights = spec.weight_bytes(tp)
    free = capacity * (1 - hardware.kv_headroom) - weights - hardware.graph_memory_gib * GIB
    if free <= 0:
        raise ValueError(
            f"{spec.name} at tp={tp} needs {weights / GIB:.1f} GiB of weights per device, "
            f"which with {hardware.graph_memory_gib} GiB of graphs and "
            f"{hardware.kv_headroom:.0%} headroom leaves no KV cache on {hardware.name} "
            f"({hardware.hbm_capacity_gib} GiB): raise tp or choose a larger device"
        )
    blocks = int(free // (block_size * spec.kv_bytes_per_token(tp)))
    if blocks < 1:
        raise ValueError(
            f"{spec.name} at tp={tp} leaves {free / GIB:.2f} GiB on {hardware.name}, less "
            f"than one KV block of {block_size} tokens: raise tp or lower block_size"
        )
    return blocks


_FIELDS = {f.name for f in dataclasses.fields(HardwareProfile)}


def read_profile(path: str | Path) -> HardwareProfile:
    """A profile YAML (the `hardware=measured` option); a bad file is a one-line error."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"hardware.path={path}: no such file")
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"hardware.path={path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"hardware.path={path} does not hold a mapping of profile fields")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValueError(f"hardware.path={path}: unknown fields {', '.join(unknown)}")
    try:
        return HardwareProfile(**data)
    except TypeError as err:  # a required field is missing
        raise ValueError(f"hardware.path={path}: {err}") from err


def write_profile(
    path: str | Path, hardware: HardwareProfile, coefficients: Mapping[str, float]
) -> Path:
    """Writes `hardware` with fitted `coefficients` as a profile YAML."""
    profile: dict[str, Any] = dataclasses.asdict(hardware)
    profile["coefficients"] = {k: float(v) for k, v in coefficients.items()}
    file = Path(path)
    file.write_text(
        "# A fitted device profile: hardware=measured hardware.path="
        + file.name
        + "\n"
        + yaml.safe_dump(profile, sort_keys=False)
    )
    return file
