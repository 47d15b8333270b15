"""One description of a model: its parameter count against the tensors a checkpoint stores
and a built-in model holds, and the kind of model read from the config's schema."""

from __future__ import annotations

import math

import pytest

from pipeline.config.checks import ConfigError, describe_model
from pipeline.executors import check_config
from pipeline.schema import HfModelConf, SpecModelConf, TransformerConf, model_kind
from stages.loading.checkpoint import read_spec
from stages.model.transformer import transformer_lm
from tests.helpers import make_config, schema_kwargs
from tests.test_checkpoint import CASES, make_folder


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_count_is_every_stored_tensor_of_a_checkpoint(tmp_path, case):
    """Biases, q/k norms, tied heads, routers and shared experts included."""
    _, config, weights = make_folder(tmp_path, case)
    stored = sum(math.prod(w.shape) for w in weights.values())
    assert read_spec(config).model.num_parameters() == stored


def test_the_count_is_every_tensor_of_a_built_in_model():
    model = transformer_lm(
        **schema_kwargs(
            TransformerConf,
            vocab_size=50,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=64,
            max_position=16,
        )
    )
    held = sum(math.prod(t.shape) for t in model._tensors())
    assert model.num_parameters == model.spec.num_parameters() == held
    assert model.spec.dtype_bytes == 4  # float32


@pytest.mark.parametrize(
    ("overrides", "kind"),
    [
        ([], TransformerConf),
        (["model=spec/llama31_8b", "executor=simulated", "hardware=h100"], SpecModelConf),
        (["model=hf", "model.path=/nowhere"], HfModelConf),
    ],
)
def test_the_kind_of_model_is_its_schema(overrides, kind):
    assert model_kind(make_config(overrides).model) is kind


def test_the_built_in_description_sizes_the_memory_check():
    spec, positions = describe_model(make_config(["model=small", "model.dtype=bfloat16"]))
    assert (spec.hidden_size, spec.num_layers, spec.head_dim, spec.dtype_bytes) == (512, 8, 64, 2)
    assert positions == 256  # max_model_len of the test limits


def test_a_description_without_weights_is_refused_by_the_real_executor():
    with pytest.raises(ConfigError, match="model=spec is a model without weights"):
        check_config(make_config(["model=spec/llama31_8b"]))


def test_a_config_read_back_from_a_run_folder_describes_the_same_model():
    """A resumed run's config is plain YAML, without the schema's types."""
    from omegaconf import OmegaConf

    from pipeline.config.describe import option_spec, rotary_positions
    from pipeline.schema import model_option

    cfg = make_config(["model=small"])
    untyped = OmegaConf.create(OmegaConf.to_container(cfg.model, resolve=True))
    assert option_spec(model_option(untyped)) == option_spec(model_option(cfg.model))
    assert rotary_positions(model_option(untyped)) == 256
