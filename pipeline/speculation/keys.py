"""The `speculative.*` keys as the simulated device's speculation (stages.simulator.speculative);
another executor refuses them (pipeline/config/executor_keys.py)."""

from __future__ import annotations

import importlib.resources
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.config.describe import option_spec
from pipeline.schema import SpecModelConf
from pipeline.speculation.published_acceptance import PUBLISHED, published_acceptance
from stages.model.spec import ModelSpec
from stages.simulator.speculative import Speculation, check_speculation


def speculation_of(cfg: DictConfig) -> Speculation | None:
    """The run's speculation, None for speculative.method=none; a bad value is a one-line
    error naming its key."""
    node = cfg.speculative
    method = str(node.method)
    try:
        acceptance = acceptance_of(node.acceptance)
        rate = float(node.proposal_rate)
        source = str(node.get("acceptance_from") or "")
        if method != "none" and source.startswith(PUBLISHED):
            found = published_acceptance(
                str(cfg.model.get("name") or ""), method, int(node.tokens),
                source.removeprefix(PUBLISHED),
            )  # fmt: skip
            acceptance, rate = list(found.acceptance), found.proposal_rate
        check_speculation(method, int(node.tokens), acceptance, str(node.draft_model), rate)
        if method == "none":
            return None
        if int(node.tokens) + 1 > cfg.max_tokens:  # a row's verify step: its proposals + 1
            raise ValueError(
                f"speculative.tokens={node.tokens}: a row's verify step takes tokens + 1 = "
                f"{int(node.tokens) + 1} token slots, more than max_tokens={cfg.max_tokens} a "
                "step: lower speculative.tokens or raise max_tokens"
            )
        if method != "draft" and node.draft_model:
            raise ValueError(
                f"speculative.draft_model={node.draft_model} is for speculative.method=draft "
                f"alone: drop it or set speculative.method=draft (not {method})"
            )
        tree = (int(node.steps), int(node.topk), int(node.draft_tokens))
        return Speculation(
            method, int(node.tokens), tuple(acceptance), int(node.mtp_layers), rate, *tree
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err


def acceptance_of(value: Any) -> list[float]:
    """`speculative.acceptance` as per-position values: a list as given, one number as a
    list of it; anything else a one-line error."""
    values = list(value) if isinstance(value, ListConfig | list | tuple) else [value]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(
            f"speculative.acceptance={value}: give a number in [0, 1] (0.8) or one a "
            "position ([0.8,0.6])"
        )
    return [float(v) for v in values]


def speculation_and_draft(cfg: DictConfig) -> tuple[Speculation | None, ModelSpec | None]:
    """The run's speculation and its draft model's description (None for either where
    there is none)."""
    speculation = speculation_of(cfg)
    draft = cfg.speculative.draft_model
    return speculation, draft_spec(draft) if speculation is not None and draft else None


def draft_spec(name: str) -> ModelSpec:
    """The description of a draft model preset (conf/model/spec/NAME.yaml, named as the
    `model` option is: spec/llama32_1b)."""
    preset = importlib.resources.files("pipeline.conf") / "model" / f"{name}.yaml"
    if not name.startswith("spec/") or not preset.is_file():
        raise ConfigError(
            f"speculative.draft_model={name}: name a model spec preset such as spec/llama32_1b "
            "(conf/model/spec/)"
        )
    values = OmegaConf.to_container(OmegaConf.create(preset.read_text(encoding="utf-8")))
    if not isinstance(values, dict):
        raise ConfigError(f"speculative.draft_model={name}: the preset holds no mapping")
    values.pop("defaults", None)
    merged = OmegaConf.merge(OmegaConf.structured(SpecModelConf), values)
    option: SpecModelConf = OmegaConf.to_object(merged)  # type: ignore[assignment]
    try:
        return option_spec(option)
    except ValueError as err:
        raise ConfigError(f"speculative.draft_model={name}: {err}") from err
