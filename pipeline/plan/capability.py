"""Rows a plan rules out before any search because the engine or the checkpoint cannot run
them: the engine on the row's device, block size and model architecture
(pipeline/config/engine_profile.py), the checkpoint's MTP head and FP8 load
(pipeline/config/checkpoint_rules.py). Each reason is the one line the plan's table shows."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checkpoint_rules import checkpoint_refusal
from pipeline.config.engine_profile import engine_refusal


def capability_rule(cfg: DictConfig) -> str:
    """Why the row's engine or checkpoint cannot serve it ("" = they can)."""
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    return engine_refusal(config) or checkpoint_refusal(config) or ""
