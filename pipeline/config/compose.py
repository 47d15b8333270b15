"""The pipeline's config composed in-process, as `python -m pipeline OVERRIDES` composes it
(Hydra's compose API): for tests, benchmarks and tools that build the pipeline themselves."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from pipeline.schema import register_schemas


@functools.cache
def schemas_registered() -> None:
    """Hydra's ConfigStore keeps what it is given for the process: storing the schemas again
    at every composition only costs (a sixth of a composition's time)."""
    register_schemas()


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    schemas_registered()
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))
