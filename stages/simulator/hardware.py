"""Hardware profiles of a simulated device, their YAML files, and the KV pool they leave.

Peak rates, memory and interconnect come from public spec sheets (cited in conf/hardware/);
the shipped profiles' efficiency factors, overhead, fill time and link latency are fitted
to published throughput figures (`python -m pipeline.calibrate --published`), their
compile times and graph memory are guesses. A profile fitted to measured steps
(`CostModel.fit`) is written with `write_profile`, which `hardware=measured
hardware.path=FILE` reads back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stages.checked_yaml import YamlFileError, boolean, finite_number, read_yaml
from stages.model.spec import ModelSpec
from stages.simulator.expert_parallel import PLAIN, ExpertParallel, routed_params_moved
from stages.simulator.precision import BF16, Precision

GIB = 1024**3
MAX_NAME = 200
MAX_RELEASE = 200  # characters of hardware.software
MAX_COEFFICIENT = 1e6
MAX_POOL_BLOCKS = 1 << 24  # a free list of 36-byte entries: 600 MB at most
# field -> (low, high, low excluded, high excluded). The highs are far beyond any device
# (the largest has a few hundred GiB, a few PFLOPS), low enough that no pool overflows.
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "bf16_tflops": (0, 1e6, True, False),
    "hbm_bandwidth_gbs": (0, 1e6, True, False),
    "hbm_capacity_gib": (0, 16384, True, False),
    "interconnect_gbs": (0, 1e6, True, False),
    "gemm_efficiency": (0, 1, True, False),
    "attention_efficiency": (0, 1, True, False),
    "memory_efficiency": (0, 1, True, False),
    "interconnect_efficiency": (0, 1, True, False),
    "step_overhead_s": (0, 3600, False, False),
    "compile_s": (0, 86400, False, False),
    "recompile_s": (0, 86400, False, False),
    "graph_memory_gib": (0, 16384, False, False),
    "kv_headroom": (0, 1, False, True),
    "fp8_tflops": (0, 1e6, False, False),
    "allreduce_latency_s": (0, 1, False, False),
    "gemm_fill_s": (0, 1, False, False),
    "interconnect_peer_gbs": (0, 1e6, False, False),
    "kv_link_gbs": (0, 1e6, False, False),
    "kv_link_latency_s": (0, 60, False, False),
    "kv_link_piece_s": (0, 1, False, False),
    "moe_layer_s": (0, 1, False, False),
    "moe_expert_s": (0, 1, False, False),
    "draft_pass_s": (0, 1, False, False),
}


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
    kv_headroom: float  # fraction of capacity kept free beside weights and KV
    pads_to_buckets: bool  # HPU: computes the padded bucket; GPU: the real tokens
    fp8_tflops: float  # dense FP8 peak; 0 = none, FP8 GEMMs run at the bf16 rate
    allreduce_latency_s: float  # fixed time of one all-reduce call over the link
    gemm_fill_s: float  # fixed time of one GEMM kernel: launch, fill, last wave
    # All-to-all links: the bandwidth to one peer, a direction; a tp-way all-reduce has
    # tp - 1 peers' links. 0: a switch (NVLink) gives interconnect_gbs whatever tp.
    interconnect_peer_gbs: float
    coefficients: Mapping[str, float]  # fitted; empty = 1.0
    # The software release whose measurements the fitted figures describe (a device's
    # figures move between releases), and the relative errors of the profile's predictions
    # by measurement method (offline, static, online): fit_median, fit_worst on the rows
    # fitted, held_out_median, held_out_worst on the rows a split-half fit held out.
    software: str
    errors: Mapping[str, Mapping[str, float]]
    # Prefill/decode disaggregation: the link a device sends its share of a prompt's KV
    # cache over to another instance (GB/s a direction, 0 = no figure), one transfer's
    # fixed time (setup, completion) and one piece's (a layer's block: a descriptor).
    kv_link_gbs: float
    kv_link_latency_s: float
    kv_link_piece_s: float
    # A MoE layer's grouped GEMMs: fixed time per layer (routing alignment, launches) and
    # per expert run (a small GEMM's fill), fitted to measured kernel times
    # (benchmarks/moe_kernels.py); 0 = not modelled.
    moe_layer_s: float
    moe_expert_s: float
    # An EAGLE head's pass beside its roofline: launches, sampling, tree bookkeeping
    # (stages/simulator/draft_tree.py); 0 = not modelled.
    draft_pass_s: float

    def __post_init__(self) -> None:
        """Every field checked for its type and range, whichever file it came from: a NaN
        overhead would give a run of NaN metrics, a petabyte of memory a block list no
        machine holds."""
        if not isinstance(self.name, str) or not 0 < len(self.name) <= MAX_NAME:
            raise ValueError(
                f"hardware.name={self.name!r:.60} must be a name of 1 to {MAX_NAME} characters"
            )
        for key, (low, high, open_low, open_high) in _RANGES.items():
            value = finite_number(getattr(self, key), f"hardware.{key}")
            if (
                value < low
                or value > high
                or (open_low and value == low)
                or (open_high and value == high)
            ):
                left, right = "(" if open_low else "[", ")" if open_high else "]"
                raise ValueError(
                    f"hardware.{key}={value:g} must be in {left}{low:g}, {high:g}{right}"
                )
            object.__setattr__(self, key, value)
        boolean(self.pads_to_buckets, "hardware.pads_to_buckets")
        if not isinstance(self.coefficients, Mapping):
            raise ValueError(
                f"hardware.coefficients={self.coefficients!r:.60} must map names to factors"
            )
        coefficients = {}
        for name, factor in dict(self.coefficients).items():
            key = f"hardware.coefficients.{name}"
            coefficients[str(name)] = value = finite_number(factor, key)
            if not 0 <= value <= MAX_COEFFICIENT:
                raise ValueError(f"{key}={value} must be in [0, {MAX_COEFFICIENT:g}]")
        object.__setattr__(self, "coefficients", coefficients)
        self._check_release_and_errors()

    def _check_release_and_errors(self) -> None:
        """`software` a short string; `errors` methods mapping names to fractions in [0, 10]."""
        if not isinstance(self.software, str) or len(self.software) > MAX_RELEASE:
            raise ValueError(
                f"hardware.software={self.software!r:.60} must be at most {MAX_RELEASE} characters"
            )
        if not isinstance(self.errors, Mapping):
            raise ValueError(f"hardware.errors={self.errors!r:.60} must map methods to errors")
        errors: dict[str, dict[str, float]] = {}
        for method, entry in dict(self.errors).items():
            if not isinstance(entry, Mapping):
                raise ValueError(f"hardware.errors.{method} must map names to fractions")
            errors[str(method)] = checked = {}
            for name, value in dict(entry).items():
                key = f"hardware.errors.{method}.{name}"
                checked[str(name)] = number = finite_number(value, key)
                if not 0 <= number <= 10:
                    raise ValueError(f"{key}={number} must be a fraction in [0, 10]")
        object.__setattr__(self, "errors", errors)

    def gemm_flops_per_s(self, fp8: bool = False) -> float:
        """Achieved GEMM rate: the FP8 peak for FP8 GEMMs where the device has one."""
        peak = self.fp8_tflops if fp8 and self.fp8_tflops else self.bf16_tflops
        return peak * 1e12 * self.gemm_efficiency

    @property
    def attention_flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12 * self.attention_efficiency

    @property
    def memory_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbs * 1e9 * self.memory_efficiency

    def interconnect_bytes_per_s(self, tp: int = 8) -> float:
        """Achieved all-reduce bandwidth of one device at `tp`: its links to the tp - 1
        peers where links join devices all to all, else (a switch) all of it."""
        gbs = self.interconnect_gbs
        if self.interconnect_peer_gbs:
            gbs = min(gbs, max(tp - 1, 1) * self.interconnect_peer_gbs)
        return gbs * 1e9 * self.interconnect_efficiency


def kv_pool_blocks(
    spec: ModelSpec,
    hardware: HardwareProfile,
    block_size: int,
    tp: int,
    precision: Precision = BF16,
    parallel: ExpertParallel = PLAIN,
) -> int:
    """KV blocks that fit one device: capacity less weights, graph memory and headroom,
    weights and KV slots in `precision`. Under expert parallelism a device holds E / ep
    whole experts of each MoE layer; its KV pool is its dp replica's share."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    capacity = hardware.hbm_capacity_gib * GIB
    weights = precision.model_weight_bytes(spec, tp)
    if not parallel.plain:
        weights += routed_params_moved(spec, tp, parallel) * precision.weight_bytes(
            spec.dtype_bytes
        )
    free = capacity * (1 - hardware.kv_headroom) - weights - hardware.graph_memory_gib * GIB
    if free <= 0:
        raise ValueError(
            f"{spec.name} at tp={tp} needs {weights / GIB:.1f} GiB of weights per device, "
            f"which with {hardware.graph_memory_gib} GiB of graphs and "
            f"{hardware.kv_headroom:.0%} headroom leaves no KV cache on {hardware.name} "
            f"({hardware.hbm_capacity_gib} GiB): raise tp or choose a larger device"
        )
    kv_per_token = spec.kv_bytes_per_token(tp) * precision.kv_bytes(spec.dtype_bytes)
    blocks = int(free // (block_size * kv_per_token / spec.dtype_bytes))
    if blocks < 1:
        raise ValueError(
            f"{spec.name} at tp={tp} leaves {free / GIB:.2f} GiB on {hardware.name}, less "
            f"than one KV block of {block_size} tokens: raise tp or lower block_size"
        )
    if blocks > MAX_POOL_BLOCKS:
        raise ValueError(
            f"{hardware.name} ({hardware.hbm_capacity_gib:g} GiB) would hold {blocks} KV blocks "
            f"of {block_size} tokens, more than the {MAX_POOL_BLOCKS} a simulated pool may "
            "have: set num_blocks, or raise block_size"
        )
    return blocks


_FIELDS = {f.name for f in dataclasses.fields(HardwareProfile)}
# Fields older profile files lack, and what they then are (no release named, no errors).
_DEFAULTED: dict[str, Any] = {
    "software": "",
    "errors": {},
    "kv_link_gbs": 0.0,
    "kv_link_latency_s": 0.0,
    "kv_link_piece_s": 0.0,
    "moe_layer_s": 0.0,
    "moe_expert_s": 0.0,
    "draft_pass_s": 0.0,
}


def read_profile(path: str | Path, optional: Mapping[str, Any] | None = None) -> HardwareProfile:
    """A profile YAML (the `hardware=measured` option), whose fields in `optional` may be
    left out and then take its values (the schema's defaults, pipeline.profiles.measured_profile);
    a bad file is a one-line error naming the file and the field. Without `optional` the file
    gives every field, as write_profile writes it: what a run folder whose saved config names
    this function as its target needs when it is resumed."""
    optional = optional or {}
    what = f"hardware.path={path}"
    try:
        data = read_yaml(path, what)
    except YamlFileError as err:
        raise ValueError(str(err)) from err
    if not isinstance(data, dict):
        raise ValueError(f"{what} does not hold a mapping of profile fields")
    data.pop("defaults", None)  # a profile in conf/hardware's form names its schema
    unknown = sorted(str(k) for k in set(data) - _FIELDS)
    if unknown:
        raise ValueError(f"{what}: unknown fields {', '.join(unknown)}")
    missing = sorted(_FIELDS - set(data) - set(optional) - set(_DEFAULTED))
    if missing:
        raise ValueError(
            f"{what}: no {', '.join(missing)}: add them (write_profile writes every field)"
        )
    try:
        return HardwareProfile(**{**_DEFAULTED, **optional, **data})
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from err


def write_profile(
    path: str | Path, hardware: HardwareProfile, coefficients: Mapping[str, float]
) -> Path:
    """Writes `hardware` with fitted `coefficients` as a profile YAML."""
    file = Path(path)
    file.write_text(profile_yaml(file.name, hardware, coefficients))
    return file


def profile_yaml(name: str, hardware: HardwareProfile, coefficients: Mapping[str, float]) -> str:
    """The profile YAML of `hardware` with fitted `coefficients`, to be saved as `name`."""
    profile: dict[str, Any] = dataclasses.asdict(hardware)
    profile["coefficients"] = {k: float(v) for k, v in coefficients.items()}
    header = f"# A fitted device profile: hardware=measured hardware.path={name}\n"
    return header + yaml.safe_dump(profile, sort_keys=False)
