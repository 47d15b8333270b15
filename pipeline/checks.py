"""Cross-field checks on the composed config: one line naming the keys and what to set."""

from __future__ import annotations

import importlib.util
import sys

from omegaconf import DictConfig


class ConfigError(ValueError):
    """An impossible configuration; the message says which keys to change."""


_HPU_OPS_PACKAGES = (
    "paddle-custom-device for intel_hpu with the paddlenlp_ops custom ops built from "
    "PaddleCustomDevice backends/intel_hpu/custom_ops"
)


def _hpu_plugin_present() -> bool:
    import paddle

    return bool(
        paddle.is_compiled_with_custom_device("intel_hpu")
        and paddle.device.get_custom_device_count("intel_hpu") > 0
    )


def _hpu_ops_present() -> bool:
    try:
        return importlib.util.find_spec("paddlenlp_ops") is not None
    except ValueError:  # imported already, without a module spec
        return "paddlenlp_ops" in sys.modules


def check_config(cfg: DictConfig) -> None:
    bs = cfg.block_size
    if bs < 1 or bs & (bs - 1):
        raise ConfigError(f"block_size={bs} is not a power of two: set block_size=16, 64 or 128")
    simulated = cfg.executor.name == "simulated"
    if cfg.model.get("_target_") == "stages.simulator.spec.model_spec" and not simulated:
        raise ConfigError(
            "model=spec is a model without weights, for the simulated device: add "
            "executor=simulated (and a hardware=...), or serve model=tiny, small or hf"
        )
    if cfg.max_tokens < 1 or cfg.max_num_seqs < 1:
        raise ConfigError("max_tokens and max_num_seqs must be >= 1")
    if cfg.max_tokens < cfg.max_num_seqs:
        raise ConfigError(
            f"max_tokens={cfg.max_tokens} < max_num_seqs={cfg.max_num_seqs}: a full decode "
            "batch would not fit one step; raise max_tokens or lower max_num_seqs"
        )
    if cfg.max_model_len < 2:
        raise ConfigError(f"max_model_len={cfg.max_model_len}: must be >= 2")
    if cfg.num_blocks < 0:
        raise ConfigError(f"num_blocks={cfg.num_blocks}: must be >= 0 (0 derives it)")
    if cfg.num_threads < 1:
        raise ConfigError(f"num_threads={cfg.num_threads}: must be >= 1")
    if cfg.device not in ("cpu", "intel_hpu"):
        raise ConfigError(f"device={cfg.device}: choose device=cpu or device=intel_hpu")
    aligned = cfg.scheduler.get("align_chunks", False)
    if aligned and cfg.max_tokens < bs:
        raise ConfigError(
            f"max_tokens={cfg.max_tokens} < block_size={bs} with scheduler.align_chunks=true: "
            "no chunk could ever be a whole block; raise max_tokens or lower block_size"
        )
    threshold = cfg.scheduler.get("long_prefill_threshold", 0)
    if threshold < 0 or (aligned and 0 < threshold < bs):
        raise ConfigError(
            f"scheduler.long_prefill_threshold={threshold}: use 0 (off) or a value >= "
            f"block_size={bs} when chunks are block-aligned"
        )
    ops = cfg.attention.get("ops")
    if ops == "intel_hpu":
        if cfg.device != "intel_hpu":
            raise ConfigError(
                f"attention.ops=intel_hpu needs device=intel_hpu and {_HPU_OPS_PACKAGES}, "
                "or set attention.ops=cpu"
            )
        if cfg.scheduler.get("align_chunks") is False:
            raise ConfigError(
                "attention.ops=intel_hpu writes the cache in whole blocks: set "
                "scheduler.align_chunks=true"
            )
    if cfg.device == "intel_hpu" and not _hpu_plugin_present():
        install = _HPU_OPS_PACKAGES if ops == "intel_hpu" else "paddle-custom-device for intel_hpu"
        raise ConfigError(
            f"device=intel_hpu but no Intel HPU is visible to Paddle: install {install} and "
            "the Gaudi driver, or set device=cpu"
        )
    if ops == "intel_hpu" and not _hpu_ops_present():
        raise ConfigError(
            f"attention.ops=intel_hpu: paddlenlp_ops is missing; install {_HPU_OPS_PACKAGES}"
        )
