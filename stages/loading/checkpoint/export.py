"""Writes a built-in model as a LlamaForCausalLM folder (config.json, model.safetensors), so
tests and benchmarks can load the same weights through the checkpoint loader or another
engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stages.model.transformer import TransformerLM


def export_hf_llama(
    model: TransformerLM,
    folder: str | Path,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> Path:
    """Writes `model` as a LlamaForCausalLM folder (config.json, model.safetensors).
    Returns the folder."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = model.spec
    biased = spec.qkv_bias or spec.out_bias or spec.mlp_bias or spec.lm_head_bias
    if model.rope_interleaved or biased or spec.moe is not None or spec.qk_norm:
        raise ValueError("export_hf_llama writes dense Llama models (rotate-half RoPE, no biases)")
    save_file(_llama_tensors(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = _llama_config(model)
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def _llama_tensors(model: TransformerLM) -> dict[str, np.ndarray]:
    """The weights under Hugging Face's Llama names. HF Linear weights are [out, in]; the
    model keeps [in, out] for its matmuls, so every projection is transposed."""
    from stages.model.int8_weight import dense
    from stages.model.transformer import DenseMLP

    d = model.spec
    q_width, kv_width = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim

    def host(tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.numpy())

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": host(model.embed)}
    for index, layer in enumerate(model.layers):
        prefix = f"model.layers.{index}."
        qkv, mlp = host(dense(layer.qkv)), layer.mlp
        assert isinstance(mlp, DenseMLP)  # export_hf_llama refuses MoE models
        tensors.update(
            {
                prefix + "input_layernorm.weight": host(layer.attn_norm),
                prefix + "self_attn.q_proj.weight": qkv[:, :q_width].T.copy(),
                prefix + "self_attn.k_proj.weight": qkv[:, q_width : q_width + kv_width].T.copy(),
                prefix + "self_attn.v_proj.weight": qkv[:, q_width + kv_width :].T.copy(),
                prefix + "self_attn.o_proj.weight": host(dense(layer.out)).T.copy(),
                prefix + "post_attention_layernorm.weight": host(layer.mlp_norm),
                prefix + "mlp.gate_proj.weight": host(mlp.gate).T.copy(),
                prefix + "mlp.up_proj.weight": host(mlp.up).T.copy(),
                prefix + "mlp.down_proj.weight": host(dense(mlp.down)).T.copy(),
            }
        )
    tensors["model.norm.weight"] = host(model.final_norm)
    if model.lm_head is not None:
        tensors["lm_head.weight"] = host(model.lm_head).T.copy()
    return tensors


def _llama_config(model: TransformerLM) -> dict[str, Any]:
    d = model.spec
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": d.vocab_size,
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": model.max_position,
        "rms_norm_eps": model.rms_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": model.rope_scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": model.lm_head is None,
        "torch_dtype": model.dtype,
    }
