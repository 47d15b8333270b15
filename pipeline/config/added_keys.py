"""A key added to a config node (`+scheduler.block_size=8`) that its schema does not declare:
Hydra's `+` opens the node for it, and the stage would fail on it only once it is built. A
limit's name (block_size, max_tokens, ...) is the run's, set at the top; anything else is
not a key of that stage."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.schema import PipelineConf

RUN_KEYS = frozenset(key.name for key in dataclasses.fields(PipelineConf))


def _added(node: DictConfig, path: str) -> tuple[str, Any, type] | None:
    """(dotted key, value, the node's schema) of the first key a node's schema lacks."""
    schema = OmegaConf.get_type(node)
    declared = (
        {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    )
    for key, value in node.items_ex(resolve=False):
        name = f"{path}.{key!s}"
        if declared is not None and key not in declared:
            return name, value, schema
        if isinstance(value, DictConfig):
            found = _added(value, name)
            if found:
                return found
    return None


def check_added_keys(cfg: DictConfig) -> None:
    """Refuses, in one line, a key no schema declares where it was added to a group (the
    top level takes the commands' own, such as +resume)."""
    for group, node in cfg.items_ex(resolve=False):
        found = _added(node, str(group)) if isinstance(node, DictConfig) else None
        if found is None:
            continue
        name, value, schema = found
        key = name.rsplit(".", 1)[-1]
        if key in RUN_KEYS:
            raise ConfigError(
                f"{name}={value}: {key} is the run's, not {schema.__name__}'s; set "
                f"{key}={value} instead"
            )
        raise ConfigError(f"{name}={value}: {schema.__name__} has no key {key}; drop it")
