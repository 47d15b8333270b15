"""What a `model` option describes before anything is built: the model's description
(ModelSpec) and its rotary table's positions, from the option's keys or the checkpoint
files it names. The memory check, the simulated device and calibration size a model from
this alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.schema.model import (
    GgufModelConf,
    HfModelConf,
    ModelOption,
    SpecModelConf,
    TransformerConf,
)
from stages.model.spec import ModelSpec, built_in_spec, dtype_bytes
from stages.model.spec_option import model_spec

if TYPE_CHECKING:  # the checkpoint readers load late: a simulated run needs none of them
    from stages.loading.checkpoint.config import CheckpointSpec


def option_spec(option: ModelOption) -> ModelSpec:
    """The model's description; ValueError names the key or file at fault."""
    if isinstance(option, TransformerConf):
        sizes = (option.vocab_size, option.hidden_size, option.num_layers, option.num_heads)
        widths = (option.num_kv_heads, option.intermediate_size, option.head_dim)
        return built_in_spec(*sizes, *widths, dtype=option.dtype)
    if isinstance(option, SpecModelConf):
        return model_spec(**{k: v for k, v in vars(option).items() if k != "_target_"})
    if isinstance(option, HfModelConf):
        from stages.loading.checkpoint import read_folder_spec

        checkpoint = read_folder_spec(option.path)
        name = Path(option.path).expanduser().name
    else:
        checkpoint = _gguf_spec(option)
        name = Path(option.path).expanduser().stem
    return dataclasses.replace(checkpoint.model, name=name, dtype_bytes=dtype_bytes(option.dtype))


def rotary_positions(option: ModelOption) -> int:
    """Positions of the rotary table the model would build (0: none)."""
    if isinstance(option, SpecModelConf):
        return 0
    if isinstance(option, TransformerConf) or option.max_position:
        return option.max_position
    if isinstance(option, HfModelConf):
        from stages.loading.checkpoint import read_folder_spec

        return read_folder_spec(option.path).max_position_embeddings
    return _gguf_spec(option).max_position_embeddings


def _gguf_spec(option: GgufModelConf) -> CheckpointSpec:
    from stages.loading.gguf.config import gguf_spec
    from stages.loading.gguf.reader import read_gguf_header

    return gguf_spec(read_gguf_header(option.path))
