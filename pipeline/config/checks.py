"""Cross-field checks on the composed config: one line naming the keys and what to set."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.describe import option_spec, rotary_positions
from pipeline.schema.model import ModelOption, model_kind, model_option
from pipeline.schema.pipeline import PipelineConf, schema_view
from stages.device import Device
from stages.forward.bucket_axes import derived_axes
from stages.forward.buckets import Bucketing
from stages.model.spec import ModelSpec
from stages.workload import MAX_ARRIVAL_S  # one bound for every workload's arrivals


class ConfigError(ValueError):
    """An impossible configuration; the message says which keys to change."""


_HPU_OPS_PACKAGES = (
    "paddle-custom-device for intel_hpu with the paddlenlp_ops custom ops built from "
    "PaddleCustomDevice backends/intel_hpu/custom_ops"
)


def _hpu_plugin_present() -> bool:
    import paddle

    return bool(
        paddle.is_compiled_with_custom_device(Device.intel_hpu)
        and paddle.device.get_custom_device_count(Device.intel_hpu) > 0
    )


def _hpu_ops_present() -> bool:
    try:
        return importlib.util.find_spec("paddlenlp_ops") is not None
    except ValueError:  # imported already, without a module spec
        return "paddlenlp_ops" in sys.modules


def check_common(cfg: DictConfig) -> None:
    """The checks every executor's config passes (pipeline.executors.check_config adds the
    executor's own)."""
    check_bounds(cfg)
    conf = schema_view(cfg)
    bs = conf.block_size
    if bs < 1 or bs & (bs - 1):
        raise ConfigError(f"block_size={bs} is not a power of two: set block_size=16, 64 or 128")
    _check_dtype_bytes(cfg)
    _check_limits(conf)
    check_copies(cfg)
    _check_rotary_table(cfg, conf.max_model_len)
    _check_chunks(conf, bs)


def check_has_weights(cfg: DictConfig) -> None:
    """An executor that runs the model's layers needs its weights."""
    if not _model_kind(cfg).has_weights:
        raise ConfigError(
            "model=spec is a model without weights, for the simulated device: add "
            "executor=simulated (and a hardware=...), or serve model=tiny, small or hf"
        )


def _check_dtype_bytes(cfg: DictConfig) -> None:
    """A weightless model's native precision: bytes of one weight and one KV value. A
    value between is no dtype, and 8-bit weights or KV are a precision choice of their
    own, not a smaller model."""
    value = cfg.model.get("dtype_bytes")
    if value is not None and value not in (2, 4):
        raise ConfigError(
            f"model.dtype_bytes={value}: give 2 (bf16 or fp16, the default) or 4 (fp32); "
            "8-bit weights and KV cache are the top-level quantization and kv_cache_dtype"
        )


def _model_kind(cfg: DictConfig) -> type[ModelOption]:
    try:
        return model_kind(cfg.model)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def describe_model(cfg: DictConfig) -> tuple[ModelSpec, int]:
    """(The model's description, its rotary table's positions), from the model option's
    keys or a checkpoint's config.json; nothing is loaded."""
    try:
        option = model_option(cfg.model)
        return option_spec(option), rotary_positions(option)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def check_model_context(cfg: DictConfig, spec: ModelSpec) -> None:
    """Refuses a max_model_len past the context the model was trained for, where its
    description states one (a model=spec preset or config.json)."""
    limit, max_model_len = spec.max_position_embeddings, schema_view(cfg).max_model_len
    if limit and max_model_len > limit:
        raise ConfigError(
            f"max_model_len={max_model_len} is above {spec.name}'s context length "
            f"(model.max_position_embeddings={limit}): lower max_model_len to {limit} or less"
        )


def _check_limits(conf: PipelineConf) -> None:
    if conf.max_tokens < 1 or conf.max_num_seqs < 1:
        raise ConfigError("max_tokens and max_num_seqs must be >= 1")
    if conf.max_tokens < conf.max_num_seqs:
        raise ConfigError(
            f"max_tokens={conf.max_tokens} < max_num_seqs={conf.max_num_seqs}: a full decode "
            "batch would not fit one step; raise max_tokens or lower max_num_seqs"
        )
    if conf.max_model_len < 2:
        raise ConfigError(f"max_model_len={conf.max_model_len}: must be >= 2")
    if conf.num_blocks < 0:
        raise ConfigError(f"num_blocks={conf.num_blocks}: must be >= 0 (0 derives it)")
    if not 1 <= conf.tp <= 1024:
        raise ConfigError(f"tp={conf.tp}: the tensor-parallel degree must be in 1..1024 (1 card)")


# The keys a stage group repeats from the top (`scheduler.max_tokens: ${max_tokens}`): one
# value for the whole run, set at the top, where every check reads it.
COPIED_KEYS = ("max_tokens", "max_num_seqs", "max_model_len")
COPYING_GROUPS = ("scheduler", "metadata", "workload")


def check_copies(cfg: DictConfig) -> None:
    """A group's copy of a top-level limit (`scheduler.max_tokens=8`) is not a second
    value: it is refused, naming the key to set instead."""
    for group in COPYING_GROUPS:
        node = cfg.get(group)
        for key in COPIED_KEYS:
            if node is None or key not in node:
                continue
            value = node[key]
            if value != cfg[key]:
                raise ConfigError(
                    f"{group}.{key}={value} differs from {key}={cfg[key]}: it is a copy of the "
                    f"run's {key}; set {key}={value} instead"
                )


def _check_rotary_table(cfg: DictConfig, max_model_len: int) -> None:
    """model.max_position follows max_model_len (0: the checkpoint's context); set below it,
    the rotary table would end before a request may, and the run would fail mid-step."""
    positions = cfg.model.get("max_position") or 0
    if 0 < positions < max_model_len:
        raise ConfigError(
            f"model.max_position={positions} < max_model_len={max_model_len}: the rotary "
            f"table would end before a request may; drop model.max_position (it follows "
            f"max_model_len) or set max_model_len={positions}"
        )


def _check_chunks(conf: PipelineConf, bs: int) -> None:
    aligned = conf.scheduler.get("align_chunks", False)
    if aligned and conf.max_tokens < bs:
        raise ConfigError(
            f"max_tokens={conf.max_tokens} < block_size={bs} with scheduler.align_chunks=true: "
            "no chunk could ever be a whole block; raise max_tokens or lower block_size"
        )
    threshold = conf.scheduler.get("long_prefill_threshold", 0)
    if threshold < 0 or (aligned and 0 < threshold < bs):
        raise ConfigError(
            f"scheduler.long_prefill_threshold={threshold}: use 0 (off) or a value >= "
            f"block_size={bs} when chunks are block-aligned"
        )


def check_paddle_device(cfg: DictConfig) -> None:
    """The Paddle executor's own keys: its math threads, the device its tensors live on and
    the attention ops that device runs."""
    conf = schema_view(cfg)
    if not 1 <= conf.num_threads <= MAX_THREADS:  # beyond, OpenMP aborts the process
        raise ConfigError(f"num_threads={conf.num_threads}: must be in 1..{MAX_THREADS}")
    if conf.device not in set(Device):
        raise ConfigError(f"device={conf.device}: choose device=cpu or device=intel_hpu")
    ops = conf.attention.get("ops")
    if ops == Device.intel_hpu:
        if conf.device != Device.intel_hpu:
            raise ConfigError(
                f"attention.ops=intel_hpu needs device=intel_hpu and {_HPU_OPS_PACKAGES}, "
                "or set attention.ops=cpu"
            )
        if conf.scheduler.get("align_chunks") is False:
            raise ConfigError(
                "attention.ops=intel_hpu writes the cache in whole blocks: set "
                "scheduler.align_chunks=true"
            )
    if conf.device == Device.intel_hpu and not _hpu_plugin_present():
        plugin = "paddle-custom-device for intel_hpu"
        install = _HPU_OPS_PACKAGES if ops == Device.intel_hpu else plugin
        raise ConfigError(
            f"device=intel_hpu but no Intel HPU is visible to Paddle: install {install} and "
            "the Gaudi driver, or set device=cpu"
        )
    if ops == Device.intel_hpu and not _hpu_ops_present():
        raise ConfigError(
            f"attention.ops=intel_hpu: paddlenlp_ops is missing; install {_HPU_OPS_PACKAGES}"
        )


# ------------------------------------------------------------------------ bounds and memory

MAX_REQUESTS = 1_000_000  # per workload (or part): more is a typo, and each request is held
BUCKET_ENTRY_BYTES = 44  # a Python int in a list (36) and its int64 copy (8)
BLOCK_ENTRY_BYTES = 36  # a free-list entry of the block pool
ROPE_BYTES_PER_DIM = 16  # float64 angles, cos and sin, then their float32 tables
REQUEST_BYTES, TOKEN_BYTES = 4096, 16  # a request's fixed part; a prompt token's id and text
# The largest CPU hosts have a few hundred cores (2 x 192 in a dual AMD EPYC 9965 host,
# 768 hardware threads); 100,000 made OpenMP abort the process (exit 134).
MAX_THREADS = 1024
MAX_LAYERS = 4096  # the deepest published decoders have a few hundred


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _check_workload_bounds(key: str, value: Any, node: dict[str, Any]) -> None:
    name = key.rsplit(".", 1)[-1]
    if name == "num_requests" and value > MAX_REQUESTS:
        raise ConfigError(f"{key}={value} is above the limit of {MAX_REQUESTS} requests")
    if name == "start_s" and not 0 <= value <= MAX_ARRIVAL_S:
        raise ConfigError(f"{key}={value}: must be within 0 and {MAX_ARRIVAL_S:.0f} s (a day)")
    if name == "rate" and value > 0:
        last = node.get("start_s", 0.0) + node.get("num_requests", 1) / value
        if last > MAX_ARRIVAL_S:
            raise ConfigError(
                f"{key}={value} spreads the requests over about {last:.3g} s, more than a day: "
                "raise the rate (requests per second) or set 0 for all at once"
            )


def _is_seed(value: Any) -> bool:
    if value is None:  # no seed of its own
        return True
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def check_bounds(cfg: DictConfig) -> None:
    """Every number is finite, and every count and time of the workload within its limits."""
    flat = _flat(_container(cfg))
    # Shallow keys first: `seed=-1` is named, not the model.seed that refers to it.
    for key, value in sorted(flat.items(), key=lambda item: item[0].count(".")):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value}: must be a finite number")
        if key.rsplit(".", 1)[-1].endswith("seed") and not _is_seed(value):
            raise ConfigError(f"{key}={value}: a seed must be a whole number >= 0 (and < 2**63)")
    workload = _container(cfg.workload)
    nodes = [workload, *(workload.get("parts") or {}).values()]
    for node in nodes:
        for name, value in node.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                prefix = (
                    "workload" if node is workload else f"workload.parts.{_part(workload, node)}"
                )
                _check_workload_bounds(f"{prefix}.{name}", value, node)


def _container(node: DictConfig) -> dict[str, Any]:
    """A config node as plain, resolved dicts and lists."""
    container = OmegaConf.to_container(node, resolve=True)
    assert isinstance(container, dict)
    return container  # type: ignore[return-value]  # keys of a config are strings


def _part(workload: dict[str, Any], node: dict[str, Any]) -> str:
    return next(name for name, part in workload["parts"].items() if part is node)


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _bucket_entries(cfg: DictConfig, num_blocks: int) -> int:
    """How many sizes the metadata builder's bucket axes will hold (0 keys derived)."""
    conf = schema_view(cfg)
    limits = (conf.block_size, conf.max_tokens, conf.max_num_seqs, conf.max_model_len)
    total = 0
    prefix = bool(cfg.get("prefix_caching", False))
    for name, derived in derived_axes(*limits, max(num_blocks, 1), prefix).items():
        axis = conf.metadata.get(name) or {}
        lo, step, top = (axis.get(key) or derived[key] for key in ("min", "step", "max"))
        if conf.metadata.get("bucketing") == Bucketing.exponential:
            total += _doublings(lo, top) + 1
            continue
        # a derived decode blocks axis steps up to the pool, then doubles (Axis.sizes)
        dense = min(top, derived.get("dense_max") or top) if not axis.get("max") else top
        total += max(1, (dense - lo) // max(step, 1) + 2) + _doublings(dense, top)
    return total


def _doublings(low: int, high: int) -> int:
    """How many times `low` doubles before reaching `high` (about)."""
    return int(math.log2(max(high / max(low, 1), 1)))


def memory_estimate(cfg: DictConfig, num_blocks: int) -> dict[str, int]:
    """Bytes each large allocation will take: the KV pool, the weights, the rotary table,
    the bucket tables, the block pool's free list and the requests."""
    spec, positions = describe_model(cfg)
    if spec.num_layers > MAX_LAYERS:
        raise ConfigError(
            f"the model has {spec.num_layers} layers, above the limit of {MAX_LAYERS}: check "
            "num_hidden_layers in its config.json (or model.num_layers)"
        )
    kv = (num_blocks + 1) * schema_view(cfg).block_size * spec.kv_bytes_per_token()
    workload = _container(cfg.workload)
    parts = list((workload.get("parts") or {}).values()) or [workload]
    requests = 0
    for part in parts:
        if "max_prompt_tokens" in part:
            count = part.get("num_requests", 0)
            requests += count * (REQUEST_BYTES + TOKEN_BYTES * part["max_prompt_tokens"])
        elif part.get("path"):
            size = Path(str(part["path"])).expanduser()
            requests += 4 * TOKEN_BYTES * (size.stat().st_size if size.is_file() else 0)
    return {
        "KV cache": kv,
        "weights": spec.weight_bytes(),
        "rotary table": positions * spec.head_dim * ROPE_BYTES_PER_DIM,
        "bucket tables": _bucket_entries(cfg, num_blocks) * BUCKET_ENTRY_BYTES,
        "block pool": num_blocks * BLOCK_ENTRY_BYTES,
        "requests": requests,
    }


# What to lower when a part of the estimate is the largest.
_REMEDY = {
    "KV cache": "num_blocks (0 derives what the workload needs)",
    "weights": "the model's size",
    "rotary table": "max_model_len",
    "bucket tables": "max_num_seqs, max_tokens or the metadata bucket axes",
    "block pool": "num_blocks",
    "requests": "workload.num_requests or the prompt lengths",
}


def _gb(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_memory(cfg: DictConfig, num_blocks: int, available: int | None = None) -> None:
    """Refuses a run whose allocations would not fit the machine's available memory."""
    available = mem_available() if available is None else available
    if available is None:
        return
    parts = memory_estimate(cfg, num_blocks)
    need = sum(parts.values())
    if need > available:
        biggest = sorted(parts.items(), key=lambda kv: -kv[1])[:2]
        detail = ", ".join(f"{name} {_gb(n)}" for name, n in biggest)
        raise ConfigError(
            f"the run would need about {_gb(need)} of memory ({detail}) and the machine has "
            f"{_gb(available)} available: lower {_REMEDY[biggest[0][0]]}"
        )
