"""A GGUF file's metadata as the architecture it describes: the Hugging Face config fields
the checkpoint loader checks (stages.loading.checkpoint.read_spec), so one set of rules says what
this engine serves, whatever format the weights come in.

llama.cpp writes the sizes under the architecture's own prefix (`llama.block_count`,
`qwen2.attention.head_count`, ...); gguf-py's constants name them (`Keys.LLM`, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stages.loading.checkpoint import CheckpointSpec, check_context, read_spec
from stages.loading.gguf.reader import GgufHeader
from stages.model.rope import RopeType

# GGUF architecture -> the Hugging Face class whose rules apply.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _scalar(header: GgufHeader, key: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    value = header.metadata.get(key, default)
    if isinstance(value, np.generic):
        value = value.item()
    if value is None:
        raise ValueError(f"{header.path}: metadata {key} is missing")
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ValueError(f"{header.path}: metadata {key}={value!r} has the wrong type")
    return value


def integer(header: GgufHeader, key: str, default: int | None = None) -> int:
    value = _scalar(header, key, (int,), default)
    if value < 1:
        raise ValueError(f"{header.path}: metadata {key}={value} is out of range (>= 1)")
    return value


def number(header: GgufHeader, key: str, default: float | None = None) -> float:
    value = float(_scalar(header, key, (int, float), default))
    if not value > 0:
        raise ValueError(f"{header.path}: metadata {key}={value} is out of range (> 0)")
    return value


def architecture(header: GgufHeader) -> str:
    """general.architecture, or the one line naming it and the supported ones."""
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{header.path}: architecture {arch!r} is not supported: supported are "
            f"{', '.join(ARCHITECTURES)}"
        )
    return arch


def _vocab_size(header: GgufHeader, arch: str) -> int:
    embed = header.tensors.get("token_embd.weight")
    if f"{arch}.vocab_size" in header.metadata:
        return integer(header, f"{arch}.vocab_size")
    if embed is not None:
        return embed.shape[0]
    return len(header.metadata.get("tokenizer.ggml.tokens", ())) or integer(
        header, f"{arch}.vocab_size"
    )


def _rope_scaling(header: GgufHeader, arch: str) -> dict[str, Any] | None:
    kind = header.metadata.get(f"{arch}.rope.scaling.type", "none")
    if "rope_freqs.weight" in header.tensors:
        raise ValueError(
            f"{header.path}: rope_freqs.weight (per-frequency rotary factors, Llama 3.1 style) "
            "is not supported"
        )
    if kind == "none":
        return None
    if kind != RopeType.LINEAR:
        raise ValueError(
            f"{header.path}: {arch}.rope.scaling.type={kind!r} is not supported (none, linear)"
        )
    return {"rope_type": RopeType.LINEAR, "factor": number(header, f"{arch}.rope.scaling.factor")}


def hf_config(header: GgufHeader) -> dict[str, Any]:
    """The config.json fields the metadata gives, for read_spec."""
    arch = architecture(header)
    heads = integer(header, f"{arch}.attention.head_count")
    hidden = integer(header, f"{arch}.embedding_length")
    head_dim = integer(header, f"{arch}.attention.key_length", hidden // heads or None)
    rotary = integer(header, f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"{header.path}: {arch}.rope.dimension_count={rotary} rotates part of each head "
            f"(head_dim {head_dim}), which is not supported"
        )
    return {
        "architectures": [ARCHITECTURES[arch]],
        "vocab_size": _vocab_size(header, arch),
        "hidden_size": hidden,
        "intermediate_size": integer(header, f"{arch}.feed_forward_length"),
        "num_hidden_layers": integer(header, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": integer(header, f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "max_position_embeddings": integer(header, f"{arch}.context_length", 2048),
        "rms_norm_eps": number(header, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": number(header, f"{arch}.rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(header, arch),
        "tie_word_embeddings": "output.weight" not in header.tensors,
        "attention_bias": "blk.0.attn_output.bias" in header.tensors,
    }


def gguf_spec(header: GgufHeader) -> CheckpointSpec:
    """The architecture, checked by the checkpoint loader's rules; errors name the file."""
    config = hf_config(header)
    try:
        return read_spec(config)
    except ValueError as err:
        raise ValueError(f"{header.path}: {str(err).replace('config.json: ', '')}") from err


def check_gguf_context(header: GgufHeader, spec: CheckpointSpec, context: int) -> None:
    """check_context's refusal, naming the file rather than a config.json."""
    try:
        check_context(spec, context)
    except ValueError as err:
        raise ValueError(str(err).replace("(config.json)", f"({header.path.name})")) from err


def token_ids(header: GgufHeader, *names: str) -> list[int]:
    """The ids tokenizer.ggml.<name>_token_id gives, in order, skipping those not set."""
    ids = []
    for name in names:
        value = header.metadata.get(f"tokenizer.ggml.{name}_token_id")
        if value is not None:
            ids.append(int(value))
    return ids
