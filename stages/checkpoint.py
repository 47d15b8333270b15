"""Hugging Face-format checkpoints: a local folder of config.json and *.safetensors.

Only safetensors are read, so nothing from the folder is executed or unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from stages.model import TransformerLM


def export_hf_llama(
    model: TransformerLM,
    folder: str | Path,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> Path:
    """Writes `model` as a LlamaForCausalLM folder (config.json, model.safetensors).

    HF Linear weights are [out, in]; the model keeps [in, out] for its matmuls, so every
    projection is transposed on the way out. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = model.dims
    if model.rope_interleaved or model.has_biases or model.has_moe:
        raise ValueError("export_hf_llama writes dense Llama models (rotate-half RoPE, no biases)")
    q_width, kv_width = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim

    def host(tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.numpy())

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": host(model.embed)}
    for index, layer in enumerate(model.layers):
        prefix = f"model.layers.{index}."
        qkv = host(layer.qkv)
        gate_up = host(layer.mlp.gate_up)
        inter = gate_up.shape[1] // 2
        tensors.update(
            {
                prefix + "input_layernorm.weight": host(layer.attn_norm),
                prefix + "self_attn.q_proj.weight": qkv[:, :q_width].T.copy(),
                prefix + "self_attn.k_proj.weight": qkv[:, q_width : q_width + kv_width].T.copy(),
                prefix + "self_attn.v_proj.weight": qkv[:, q_width + kv_width :].T.copy(),
                prefix + "self_attn.o_proj.weight": host(layer.out).T.copy(),
                prefix + "post_attention_layernorm.weight": host(layer.mlp_norm),
                prefix + "mlp.gate_proj.weight": gate_up[:, :inter].T.copy(),
                prefix + "mlp.up_proj.weight": gate_up[:, inter:].T.copy(),
                prefix + "mlp.down_proj.weight": host(layer.mlp.down).T.copy(),
            }
        )
    tensors["model.norm.weight"] = host(model.final_norm)
    tied = model.lm_head is None
    if not tied:
        tensors["lm_head.weight"] = host(model.lm_head).T.copy()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    config = {
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
        "tie_word_embeddings": tied,
        "torch_dtype": model.dtype,
    }
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
