"""Schemas of the `model` options: the built-in transformer, a Hugging Face folder, a GGUF
file, and a description without weights (model=spec) for the simulated device. A schema
holds values only: what a model option describes is pipeline.config.describe's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from omegaconf import II, MISSING, DictConfig, OmegaConf

from stages.model.spec import ComputeDtype, WeightStorage

# The compute dtype a model's weights and activations take unless its option says otherwise:
# Paddle's CPU kernels are float32 (bf16 runs where the device has bf16 matmuls).
COMPUTE_DTYPE = ComputeDtype.float32


@dataclass
class TransformerConf:
    _target_: str = "stages.model.transformer.transformer_lm"
    vocab_size: int = MISSING
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    intermediate_size: int = MISSING
    max_position: int = II("max_model_len")
    head_dim: int = 0  # 0 = hidden_size / num_heads
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = II("seed")
    dtype: ComputeDtype = COMPUTE_DTYPE

    has_weights: ClassVar[bool] = True  # False: a description only, for the simulated device


@dataclass
class HfModelConf:
    _target_: str = "stages.loading.checkpoint.load_hf_model"
    path: str = MISSING  # a local Hugging Face-format folder
    dtype: ComputeDtype = COMPUTE_DTYPE  # stored bf16 / fp16 / fp32 weights are converted to it
    max_position: int = II("max_model_len")  # rotary table; 0 = max_position_embeddings

    has_weights: ClassVar[bool] = True


@dataclass
class GgufModelConf:
    _target_: str = "stages.loading.gguf.loader.load_gguf_model"
    path: str = MISSING  # a GGUF file (llama, qwen2, qwen3; F32 to Q4_K: docs/checkpoints.md)
    dtype: ComputeDtype = COMPUTE_DTYPE  # every stored type is dequantised to it
    max_position: int = II("max_model_len")  # rotary table; 0 = the file's context_length
    # int8: every projection and the lm head kept as int8 with a scale per output, a quarter
    # of the bytes a decode reads, multiplied by a compiled multi-threaded operator (inputs
    # rounded to 16 bits; docs/checkpoints.md gives the drift)
    weights: WeightStorage = WeightStorage.float32

    has_weights: ClassVar[bool] = True


@dataclass
class SpecModelConf:
    """A model without weights, for the simulated device: config.json or a preset's fields."""

    _target_: str = "stages.model.spec_option.model_spec"
    config: str = ""  # a config.json (or its folder); "" = the fields below
    name: str = ""
    vocab_size: int = 0
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0  # 0 = hidden_size / num_heads
    intermediate_size: int = 0
    tied_embeddings: bool = False
    qkv_bias: bool = False
    num_experts: int = 0  # routed experts; 0 = a dense model
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    moe_layer_start: int = 0
    moe_layer_end: int = -1  # -1 = the last layer
    moe_layer_interval: int = 1
    dtype_bytes: int = 2  # bf16
    # The context it was trained for (config.json's name); max_model_len may not exceed
    # it. 0: not stated, no limit.
    max_position_embeddings: int = 0
    # What the published checkpoint holds (read by the engines' lists and the plan's rows,
    # not by the cost model; stages.model.spec.Checkpoint): config.json's architectures[0]
    # ("" = not stated), its MTP layers (num_nextn_predict_layers; -1 = not stated), and
    # the published FP8 checkpoint an engine serves instead of quantizing this one on load
    # ("" = none published)
    architecture: str = ""
    mtp_layers: int = -1
    fp8_checkpoint: str = ""

    has_weights: ClassVar[bool] = False


SCHEMAS: dict[tuple[str, str], type] = {
    ("model", "transformer"): TransformerConf,
    ("model", "hf"): HfModelConf,
    ("model", "gguf"): GgufModelConf,
    ("model", "spec"): SpecModelConf,
}

# What a `model` option's schema says of the model it builds, before it is built: the
# memory check, the simulated device and calibration size a model from this alone.
ModelOption = TransformerConf | HfModelConf | GgufModelConf | SpecModelConf
MODEL_OPTIONS = (TransformerConf, HfModelConf, GgufModelConf, SpecModelConf)


def model_kind(node: DictConfig) -> type[ModelOption]:
    """The schema of the `model` option: each conf/model option names one first, so the
    kind of model is the config's own type. A config read back from a run folder has lost
    its types: the schema is then the one that declares the node's `_target_`."""
    kind = OmegaConf.get_type(node)
    if isinstance(kind, type) and issubclass(kind, MODEL_OPTIONS):
        return kind
    declared = {option._target_: option for option in MODEL_OPTIONS}
    target = node.get("_target_")
    if target not in declared:
        kinds = ", ".join(f"/schema/model@_here_: {n}" for (g, n) in SCHEMAS if g == "model")
        raise ValueError(f"model: the option names no model schema: begin it with one of {kinds}")
    return declared[target]


def model_option(node: DictConfig) -> ModelOption:
    """The `model` node as its schema's object, which describes the model it builds."""
    schema = OmegaConf.structured(model_kind(node))
    values = OmegaConf.to_container(node, resolve=True)  # interpolations name other keys
    return OmegaConf.to_object(OmegaConf.merge(schema, values))  # type: ignore[return-value]
