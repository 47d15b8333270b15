"""What the chosen serving engine (`engine=`, conf/engine/) runs on the run's device: the
check a run and a plan row pass, failing with the one line that says what to change, the
engine's name as metrics.json and the summaries give it, and the host time its steps add
on a simulated device."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from collections.abc import Mapping
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError
from stages.simulator.device import HostTime
from stages.simulator.hardware import HardwareProfile

NATIVE = "native"


def engine_name(cfg: Mapping[str, Any] | DictConfig) -> str:
    """The engine a config predicts; a folder written before engines existed: native."""
    engine = cfg.get("engine")
    return str(engine.get("name", NATIVE)) if isinstance(engine, Mapping | DictConfig) else NATIVE


def device_kind(hardware: Mapping[str, Any] | DictConfig) -> str:
    """`hpu` for a device that pads to buckets (Gaudi), `gpu` for one that does not."""
    pads = hardware.get("pads_to_buckets", True)
    return "gpu" if pads is False or str(pads).lower() == "false" else "hpu"


def engine_refusal(cfg: Mapping[str, Any] | DictConfig) -> str | None:
    """Why the config's engine cannot serve it on its device (its block size, its model's
    architecture, the device itself), or None; nothing is refused without a device."""
    name, hardware = engine_name(cfg), cfg.get("hardware")
    if name == NATIVE or not isinstance(hardware, Mapping | DictConfig):
        return None
    kind = device_kind(hardware)
    limits = cfg["engine"][kind]
    device = f"{hardware.get('name', kind)} ({'Gaudi' if kind == 'hpu' else 'GPU'})"
    if not limits["runs"]:
        return (
            f"engine={name} does not run on {device}: choose engine=vllm or engine=fastdeploy "
            "there, or a GPU (hardware=h100)"
        )
    sizes = list(limits["block_sizes"])
    if sizes and cfg["block_size"] not in sizes:
        return f"block_size={cfg['block_size']}: engine={name} on {device} takes {sizes}"
    architecture = cfg["model"].get("architecture") or ""
    served = list(limits["architectures"])
    if served and architecture and architecture not in served:
        model = cfg["model"].get("name") or architecture
        return (
            f"model {model} ({architecture}): engine={name} on {device} serves "
            f"{', '.join(served)}; choose engine=vllm"
        )
    return None


@functools.cache
def profile(name: str) -> dict[str, Any]:
    """An engine's profile as conf/engine/NAME.yaml gives it (its device limits are plain
    values): for the scripts of engines a native run did not simulate."""
    path = importlib.resources.files("pipeline.conf") / "engine" / f"{name}.yaml"
    return dict(yaml.safe_load(path.read_text(encoding="utf-8")))


def serves_architecture(name: str, gpu: bool, architecture: str) -> bool:
    """Whether engine NAME serves a model of `architecture` on the device ("" = not
    stated: assumed served)."""
    if name == NATIVE or not architecture:
        return True
    served = (profile(name).get("gpu" if gpu else "hpu") or {}).get("architectures") or []
    return not served or architecture in served


def host_time(cfg: DictConfig) -> HostTime:
    """The engine's host time a step on a simulated device; none for a folder written
    before profiles gave one."""
    step_s = OmegaConf.select(cfg, "engine.step_host_s", default=0.0)
    row_s = OmegaConf.select(cfg, "engine.row_host_s", default=0.0)
    try:
        return HostTime(float(step_s), float(row_s))
    except ValueError as err:
        raise ConfigError(str(err)) from err


def engine_hardware(cfg: DictConfig, hardware: HardwareProfile) -> HardwareProfile:
    """The device profile as the engine's kernels run on it: its GEMM efficiency times the
    engine's gemm_rate (1 for a folder written before profiles gave one)."""
    rate = float(OmegaConf.select(cfg, "engine.gemm_rate", default=1.0))
    if not 0 < rate <= 1:
        raise ConfigError(f"engine.gemm_rate={rate} must be in (0, 1]")
    if rate == 1:
        return hardware
    return dataclasses.replace(hardware, gemm_efficiency=hardware.gemm_efficiency * rate)


def check_engine(cfg: DictConfig) -> None:
    """The run's engine serves its model on its device at its block size."""
    reason = engine_refusal(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    if reason:
        raise ConfigError(reason)
