"""A checkpoint's config.json read into a checked description: the architecture family, the
model's dimensions (stages.model.spec.ModelSpec) and how it computes (RoPE, norms)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stages.model.rope import RopeType, rope_inv_freq
from stages.model.spec import Checkpoint, ModelSpec, MoeLayout

# Architecture families, named by their first name below.
LLAMA = "LlamaForCausalLM"
MISTRAL = "MistralForCausalLM"  # Llama's layout
QWEN2 = "Qwen2ForCausalLM"
QWEN3 = "Qwen3ForCausalLM"
ERNIE = "Ernie4_5_ForCausalLM"
ERNIE_MOE = "Ernie4_5_MoeForCausalLM"
# Every name real folders give an architecture: Baidu's remote-code classes
# (Ernie4_5_ForCausalLM) and transformers' own (Ernie4_5ForCausalLM), which write the same
# tensors; Ernie4_5MoeForCausalLM is the MoE's name in some Baidu-derived folders.
ARCHITECTURE_FAMILIES = {
    LLAMA: LLAMA,
    MISTRAL: MISTRAL,
    QWEN2: QWEN2,
    QWEN3: QWEN3,
    ERNIE: ERNIE,
    "Ernie4_5ForCausalLM": ERNIE,
    ERNIE_MOE: ERNIE_MOE,
    "Ernie4_5MoeForCausalLM": ERNIE_MOE,
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_FAMILIES)


@dataclass(frozen=True)
class CheckpointSpec:
    """What config.json says, checked: the model's description, and how it computes."""

    architecture: str  # as config.json names it
    family: str  # the architecture family of ARCHITECTURE_FAMILIES
    model: ModelSpec  # its max_position_embeddings is the config's
    rms_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rope_interleaved: bool
    sliding_window: int | None = None  # each token attends to at most this many (Mistral)

    @property
    def max_position_embeddings(self) -> int:
        return self.model.max_position_embeddings


# The largest size each field may give, checked before anything scales with it (a weight
# plan per layer, a rotary table per position): well beyond every published model.
MAX_SIZES = {
    "num_hidden_layers": 4096,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 27,
    "moe_num_experts": 1 << 12,
}


class _Fields:
    """Typed reads of config.json fields, each failing with the field's name and value."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.config.get(key, default)
        if value is None:
            raise ValueError(f"config.json has no {key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"config.json: {key}={value!r} is out of range (an integer >= {minimum})"
            )
        if value > MAX_SIZES.get(key, value):
            raise ValueError(
                f"config.json: {key}={value} is out of range (at most {MAX_SIZES[key]:,}, "
                "beyond any published model): check the file"
            )
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self.config.get(key, default)
        if value is None:
            raise ValueError(f"config.json has no {key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"config.json: {key}={value!r} is out of range (a positive number)")
        if not math.isfinite(value):  # JSON's Infinity parses
            raise ValueError(f"config.json: {key}={value!r} is not a finite number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"config.json: {key}={value!r} is out of range (true or false)")
        return value


def _rope(config: Mapping[str, Any], fields: _Fields) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and rope_scaling, or transformers' newer rope_parameters holding both."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = _Fields(params).number("rope_theta")
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        scaled = scaling.get("rope_type", RopeType.DEFAULT) != RopeType.DEFAULT
        return theta, scaling if scaled else None
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(
            f"config.json: rope_scaling={scaling!r} is out of range (an object or null)"
        )
    return fields.number("rope_theta", 10000.0), scaling or None


def _moe_layers(fields: _Fields, num_layers: int) -> frozenset[int]:
    """Which layers route to experts: every `interval`-th from start to end (inclusive, -1 =
    the last layer); the others keep a dense MLP."""
    start = fields.integer("moe_layer_start_index", 1, minimum=0)
    end = fields.config.get("moe_layer_end_index", -1)
    if end == -1:
        end = num_layers - 1
    end = _Fields({"moe_layer_end_index": end}).integer("moe_layer_end_index", minimum=0)
    interval = fields.integer("moe_layer_interval", 1)
    return frozenset(i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end)


def _moe(f: _Fields, num_layers: int) -> MoeLayout:
    num_experts, top_k = f.integer("moe_num_experts"), f.integer("moe_k")
    if top_k > num_experts:
        raise ValueError(
            f"config.json: moe_k={top_k} is out of range (at most moe_num_experts={num_experts})"
        )
    return MoeLayout(
        num_experts=num_experts,
        experts_per_token=top_k,
        expert_intermediate_size=f.integer("moe_intermediate_size"),
        num_shared_experts=f.integer("moe_num_shared_experts", 0, minimum=0),
        layers=_moe_layers(f, num_layers),
        norm_min=f.number("moe_norm_min", 1e-12),
    )


def _architecture(config: Mapping[str, Any]) -> tuple[str, str]:
    """(the name config.json gives, its family), or the one line listing the supported."""
    architectures = config.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    if name not in ARCHITECTURE_FAMILIES:
        raise ValueError(
            f"config.json: architecture {name!r} is not supported: supported are "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return name, ARCHITECTURE_FAMILIES[name]


def _dims(f: _Fields) -> dict[str, int]:
    hidden = f.integer("hidden_size")
    num_heads = f.integer("num_attention_heads")
    num_kv_heads = f.integer("num_key_value_heads", num_heads)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"config.json: num_attention_heads={num_heads} is not a multiple of "
            f"num_key_value_heads={num_kv_heads}"
        )
    head_dim = f.integer("head_dim", hidden // num_heads if hidden % num_heads == 0 else None)
    if head_dim % 2:
        raise ValueError(f"config.json: head_dim={head_dim} is out of range (rotary needs it even)")
    return dict(
        vocab_size=f.integer("vocab_size"),
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=f.integer("intermediate_size"),
    )


def _sliding_window(family: str, f: _Fields) -> int | None:
    """Mistral's window (null = none); Qwen's sliding layers are refused outright."""
    if family in (QWEN2, QWEN3) and f.flag("use_sliding_window", False):
        raise ValueError(
            "config.json: use_sliding_window=true is not supported: every layer attends to "
            "the whole context here"
        )
    if family != MISTRAL or f.config.get("sliding_window") is None:
        return None
    return f.integer("sliding_window")


def read_spec(config: Mapping[str, Any]) -> CheckpointSpec:
    """Checks config.json against what the model supports; ValueError names the field."""
    name, family = _architecture(config)
    f = _Fields(config)
    dims = _dims(f)
    num_layers = dims["num_layers"]
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"config.json: hidden_act={config['hidden_act']!r} is not supported (silu)"
        )
    sliding_window = _sliding_window(family, f)
    theta, scaling = _rope(config, f)
    rope_inv_freq(dims["head_dim"], theta, scaling)  # an unsupported scaling fails before loading
    ernie = family in (ERNIE, ERNIE_MOE)
    ernie_bias = ernie and f.flag("use_bias", False)
    llama_like = family in (LLAMA, MISTRAL, QWEN3)  # attention_bias: q, k, v and o biases
    attention_bias = llama_like and f.flag("attention_bias", False)
    mtp = config.get("num_nextn_predict_layers", 0)  # its multi-token-prediction head
    model = ModelSpec(
        **dims,
        name=family,
        checkpoint=Checkpoint(family, mtp if isinstance(mtp, int) else 0, ""),
        tied_embeddings=f.flag("tie_word_embeddings", ernie),  # ERNIE-4.5 ties by default
        qkv_bias=family == QWEN2 or attention_bias or ernie_bias,
        out_bias=attention_bias or ernie_bias,
        mlp_bias=(family in (LLAMA, MISTRAL) and f.flag("mlp_bias", False)) or ernie_bias,
        lm_head_bias=family == ERNIE_MOE and ernie_bias,
        qk_norm=family == QWEN3,
        moe=_moe(f, num_layers) if family == ERNIE_MOE else None,
        max_position_embeddings=f.integer("max_position_embeddings", 2048),
    )
    return CheckpointSpec(
        architecture=name,
        family=family,
        model=model,
        rms_eps=f.number("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_interleaved=ernie,  # ERNIE-4.5 rotates pairs (2i, 2i + 1), GLM style
        sliding_window=sliding_window,
    )


def check_context(spec: CheckpointSpec, context: int) -> None:
    """Refuses serving `context` tokens (max_model_len) where the model cannot attend to them
    all: past its position table, or past a sliding window, which this engine does not
    apply (every layer attends to the whole context)."""
    if context > spec.max_position_embeddings:
        raise ValueError(
            f"max_model_len={context} is above the model's max_position_embeddings="
            f"{spec.max_position_embeddings} (config.json): lower max_model_len"
        )
    window = spec.sliding_window
    if window is not None and window < context:
        raise ValueError(
            f"config.json: sliding_window={window} is smaller than the context of {context} "
            f"tokens, and every layer attends to the whole context here: lower max_model_len "
            f"to at most {window}"
        )
