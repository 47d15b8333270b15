"""Model specs without weights: presets against published parameter counts, config.json
against the presets, and per-device counts under tensor parallelism, written out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from pipeline.config.checks import ConfigError, check_model_context
from pipeline.executors import check_config
from pipeline.executors.build import build
from pipeline.job.run import model_context
from pipeline.schema import register_schemas
from stages.model.spec import ModelSpec, MoeLayout
from tests.helpers import run_cli, spec_of
from tests.test_cost_model import TINY, TINY_MOE

register_schemas()


def preset(name: str, *overrides: str) -> ModelSpec:
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model=spec/{name}", *overrides])
    return instantiate(cfg.model)


# Totals as the model cards (or their safetensors metadata on the Hub) publish them.
PUBLISHED = {
    "llama31_8b": 8.03e9,
    "llama31_70b": 70.6e9,
    "llama32_1b": 1.24e9,
    "qwen25_7b": 7.61e9,
    "qwen3_8b": 8.2e9,
    "ernie45_0p3b": 0.36e9,
    "ernie45_21b_a3b": 21.8e9,
    "ernie45_300b_a47b": 300e9,
    "qwen3_30b_a3b": 30.5e9,
    "qwen3_235b_a22b": 235e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_matches_the_published_total(name):
    assert preset(name).num_parameters() == pytest.approx(PUBLISHED[name], rel=0.01)


def test_published_splits_of_qwen_and_ernie_moe():
    # Qwen2.5-7B's card: 6.53B parameters without embeddings (input table and lm head).
    assert preset("qwen25_7b").active_parameters(embeddings=False) == pytest.approx(
        6.53e9, rel=0.01
    )
    # Qwen3-8B's card: 6.95B without embeddings.
    assert preset("qwen3_8b").active_parameters(embeddings=False) == pytest.approx(6.95e9, rel=0.01)
    # ERNIE-4.5-21B-A3B: "3B active" per token, rounded to a whole billion on the card, so
    # only within 5%; its 21B headline total is the 21.8B rounded down.
    ernie = preset("ernie45_21b_a3b")
    assert ernie.active_parameters(embeddings=False) == pytest.approx(3e9, rel=0.05)
    assert ernie.num_parameters() == pytest.approx(21e9, rel=0.05)
    assert ernie.num_moe_layers == 27 and ernie.num_dense_layers == 1


def test_published_active_parameters_of_the_larger_moe_presets():
    # Active per token, embeddings included, as the cards count them: ERNIE-4.5-300B-A47B
    # "47B", Qwen3-30B-A3B "3.3B activated", Qwen3-235B-A22B "22B activated". The cards
    # round to 2 significant figures, so within 2%.
    for name, active in (
        ("ernie45_300b_a47b", 47e9),
        ("qwen3_30b_a3b", 3.3e9),
        ("qwen3_235b_a22b", 22e9),
    ):
        assert preset(name).active_parameters() == pytest.approx(active, rel=0.02), name
    ernie = preset("ernie45_300b_a47b")
    assert ernie.num_moe_layers == 51 and ernie.num_dense_layers == 3
    assert preset("qwen3_235b_a22b").num_dense_layers == 0


def test_tiny_parameter_count_by_hand():
    spec = spec_of(**TINY)
    q, k, v, o = 64 * 64, 64 * 32, 64 * 32, 64 * 64
    mlp = 3 * 64 * 128
    norms = 2 * 64
    layer = q + k + v + o + mlp + norms
    assert spec.num_parameters() == 2 * layer + 64 + 2 * 1000 * 64  # final norm, untied
    tied = spec_of(**TINY, tied_embeddings=True)
    assert tied.num_parameters() == 2 * layer + 64 + 1000 * 64
    biased = spec_of(**TINY, qkv_bias=True)
    assert biased.num_parameters() - spec.num_parameters() == 2 * (64 + 32 + 32)
    assert spec.weight_bytes() == 2 * spec.num_parameters()  # bf16
    # Keys and values: 2 layers x 2 KV heads x 16 dims x 2 tensors x 2 bytes.
    assert spec.kv_bytes_per_token() == 2 * 2 * 16 * 2 * 2


def test_moe_parameters_and_experts_touched_by_hand():
    spec = spec_of(**TINY_MOE)
    assert spec.moe.layers == frozenset({1})
    attention, norms, dense = 12288, 128, 3 * 64 * 128
    expert, router = 3 * 64 * 32, 64 * 8 + 8
    moe_layer = attention + norms + router + (1 + 8) * expert
    assert spec.num_parameters() == (attention + norms + dense) + moe_layer + 64 + 2 * 64000
    active = (attention + norms + dense) + (moe_layer - 6 * expert) + 64 + 2 * 64000
    assert spec.active_parameters() == active
    # One token touches its top-2; two tokens each miss an expert with probability 6/8.
    assert spec.moe.experts_touched(1) == pytest.approx(2)
    assert spec.moe.experts_touched(2) == pytest.approx(8 * (1 - (6 / 8) ** 2))
    assert spec.moe.experts_touched(10_000) == pytest.approx(8)


def test_tensor_parallel_splits_heads_weights_and_kv():
    spec = spec_of(**TINY)
    assert spec.heads_per_device(2) == 2 and spec.kv_heads_per_device(2) == 1
    assert spec.kv_bytes_per_token(2) == spec.kv_bytes_per_token() / 2
    # tp=4 has more devices than KV heads: each device keeps one KV head, replicated.
    assert spec.kv_heads_per_device(4) == 1
    matrices = spec.linear_bytes(1)
    assert spec.linear_bytes(1, tp=2) == matrices / 2
    # Only the norm vectors (2 per layer and the final one) are replicated.
    norms = 2 * 2 * 64 + 64
    assert spec.num_parameters(2) == (spec.num_parameters() - norms) / 2 + norms
    with pytest.raises(ValueError, match="tp=3"):
        spec.check_tp(3)


def write_config(folder, **fields):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


ERNIE_21B_CONFIG = {
    "architectures": ["Ernie4_5_MoeForCausalLM"],
    "hidden_size": 2560,
    "intermediate_size": 12288,
    "num_hidden_layers": 28,
    "num_attention_heads": 20,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 103424,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "moe_num_experts": 64,
    "moe_k": 6,
    "moe_intermediate_size": 1536,
    "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1,
    "moe_layer_end_index": 27,
    "moe_layer_interval": 1,
}


def test_config_json_gives_the_presets_spec(tmp_path):
    folder = write_config(tmp_path / "ernie", **ERNIE_21B_CONFIG)
    from_json = preset("ernie45_21b_a3b", "model.name=ERNIE-4.5-21B-A3B")
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=spec", f"model.config={folder}"])
    spec = build(cfg.model)
    assert spec.name == "ernie"  # the folder's name
    assert spec.num_parameters() == from_json.num_parameters()
    assert spec.moe == from_json.moe
    assert spec.max_position_embeddings == from_json.max_position_embeddings == 131072
    qwen = write_config(
        tmp_path / "qwen",
        architectures=["Qwen2ForCausalLM"],
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    )
    assert spec_of(config=str(qwen / "config.json")) == dataclasses.replace(
        preset("qwen25_7b"), name="qwen"
    )


def test_bad_spec_configs_are_one_line_errors(tmp_path):
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=spec"])
        missing = compose(
            config_name="config", overrides=["model=spec", f"model.config={tmp_path}"]
        )
    with pytest.raises(ConfigError, match="give model.config=PATH"):
        build(cfg.model)
    with pytest.raises(ConfigError, match="config.json is missing"):
        build(missing.model)
    folder = write_config(tmp_path / "x", **{**ERNIE_21B_CONFIG, "architectures": ["Nope"]})
    with pytest.raises(ValueError, match="architecture 'Nope' is not supported"):
        spec_of(config=str(folder))
    with pytest.raises(ValueError, match="not both"):
        spec_of(config=str(folder), hidden_size=64)
    with pytest.raises(ValueError, match="model=spec/llama31_8b"):
        spec_of()
    with pytest.raises(ValueError, match="not a multiple"):
        spec_of(**{**TINY, "num_kv_heads": 3})
    with pytest.raises(ValueError, match="experts_per_token=9"):
        spec_of(**TINY, num_experts=8, experts_per_token=9, expert_intermediate_size=32)
    with pytest.raises(ValueError, match="moe_layer"):
        MoeLayout(8, 2, 32, 0, frozenset())


def test_the_engine_refuses_a_spec_without_weights():
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=spec/llama31_8b"])
    with pytest.raises(ConfigError, match="model=spec is a model without weights"):
        check_config(cfg)


# max_position_embeddings of each model's config.json on the Hugging Face Hub (the model
# cards give the same context length: 128K tokens for Llama-3.1 and Qwen2.5, 131072 ERNIE).
CONTEXT = {
    "llama31_8b": 131072,
    "llama31_70b": 131072,
    "llama32_1b": 131072,
    "qwen25_7b": 131072,
    "ernie45_0p3b": 131072,
    "ernie45_21b_a3b": 131072,
    "ernie45_300b_a47b": 131072,
    "qwen3_8b": 40960,
    "qwen3_30b_a3b": 40960,
    "qwen3_235b_a22b": 40960,
}


@pytest.mark.parametrize("name", sorted(CONTEXT))
def test_presets_state_their_context_and_refuse_a_longer_max_model_len(name):
    assert preset(name).max_position_embeddings == CONTEXT[name]
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model=spec/{name}"])
    cfg.max_model_len = CONTEXT[name]
    check_model_context(cfg, preset(name))  # up to the context: accepted
    cfg.max_model_len = CONTEXT[name] + 1
    with pytest.raises(ConfigError, match=f"max_position_embeddings={CONTEXT[name]}"):
        check_model_context(cfg, preset(name))
    assert model_context(cfg) == CONTEXT[name]  # what a cut prompt's message offers


@pytest.mark.slow
def test_a_max_model_len_past_the_presets_context_exits_2_in_one_line(tmp_path):
    result = run_cli(
        tmp_path, "pipeline", "executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b",
        "max_model_len=131073", "workload.num_requests=2", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: max_model_len=131073 is above Llama-3.1-8B's context")
