"""Which executor a key belongs to, as the schema declares it (`metadata={"executor": ...}`
on PipelineConf's fields), and the one refusal of another executor's key: set away from its
default, it is one line naming the key, its default and the executor that reads it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.schema.pipeline import Executor, PipelineConf

# Why another executor's key means nothing to this one, and how to choose the other.
WHAT_IT_RUNS = {
    Executor.paddle: "runs the model as it is, on one device",
    Executor.simulated: "computes no tensors (a cost model of `hardware` times each step)",
}
HOW_TO_CHOOSE = {
    Executor.paddle: "executor=paddle",
    Executor.simulated: "executor=simulated (with hardware=...)",
}


def owned_keys(executor: Executor) -> Iterator[dataclasses.Field[Any]]:
    """The top-level keys the schema gives to `executor` alone."""
    for key in dataclasses.fields(PipelineConf):
        if key.metadata.get("executor") == executor:
            yield key


def _default(key: dataclasses.Field[Any]) -> Any:
    if key.default_factory is not dataclasses.MISSING:
        return key.default_factory()
    return key.default


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def set_apart(cfg: DictConfig, key: dataclasses.Field[Any]) -> tuple[str, Any, Any] | None:
    """(dotted key, value, default) of the first part of `key` set away from its default; a
    group of keys (disagg.*) by its keys in name order."""
    default = _default(key)
    value = _plain(cfg.get(key.name, default))
    if not dataclasses.is_dataclass(default):
        return None if value == default else (key.name, value, default)
    defaults = dataclasses.asdict(default)  # type: ignore[arg-type]
    for name in sorted(defaults):
        if name in value and value[name] != defaults[name]:
            return f"{key.name}.{name}", value[name], defaults[name]
    return None


def refuse_others_keys(cfg: DictConfig, executor: Executor) -> None:
    """A key of another executor set apart from its default, refused in one line."""
    for other in Executor:
        if other == executor:
            continue
        for key in owned_keys(other):
            found = set_apart(cfg, key)
            if found is None:
                continue
            name, value, default = found
            shown = value.get("name", "...") if isinstance(value, dict) else value
            fix = f"drop {name}" if default is None else f"set {name}={default}"
            raise ConfigError(
                f"{name}={shown} is {other} only: executor={executor} {WHAT_IT_RUNS[executor]}; "
                f"{fix} or {HOW_TO_CHOOSE[other]}"
            )
