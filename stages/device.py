"""The devices a forward runs on, by Paddle's name for each: the top-level `device` key, and
the attention ops (`attention.ops`) built for one of them."""

from __future__ import annotations

import enum


class Device(enum.StrEnum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    cpu = "cpu"
    intel_hpu = "intel_hpu"  # Intel Gaudi, through Paddle's custom-device plugin
