"""A plain numpy forward pass of the Hugging Face architectures the loader reads.

Written from the architectures' definitions in transformers' modeling files (Llama,
Mistral, Qwen2, Qwen3, ERNIE-4.5 and ERNIE-4.5 MoE), independently of the project's model:
it takes the HF tensors by their HF names and layouts ([out, in] Linear weights; MoE
experts per expert or fused as transformers 5 keeps them), runs one sequence with dense
causal attention over all of it, in float64, one token at a time where that is the
plainest (the experts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's *.safetensors files (float32 / float16 only), as float64."""
    weights: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update({k: v.astype(np.float64) for k, v in load_file(str(path)).items()})
    return weights


def inverse_frequencies(config: Mapping[str, Any], head_dim: int) -> np.ndarray:
    params = config.get("rope_parameters") or {}  # transformers 5: theta and scaling in one
    base = params.get("rope_theta", config.get("rope_theta", 10000.0))
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    assert kind == "llama3", kind
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def linear(x: np.ndarray, w: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    y = x @ w[name + ".weight"].T
    bias = w.get(name + ".bias")
    return y if bias is None else y + bias


def swiglu(x: np.ndarray, w: Mapping[str, np.ndarray], prefix: str) -> np.ndarray:
    hidden = silu(linear(x, w, prefix + "gate_proj")) * linear(x, w, prefix + "up_proj")
    return linear(hidden, w, prefix + "down_proj")


def expert(x: np.ndarray, w: Mapping[str, np.ndarray], prefix: str, e: int) -> np.ndarray:
    """Expert e of the experts under prefix ("...mlp.experts."): per expert, or fused as
    transformers' Ernie4_5_MoeExperts computes it: linear(x, gate_up_proj[e]) chunked in
    two, gate then up; then linear(., down_proj[e])."""
    fused = w.get(prefix + "gate_up_proj")
    if fused is None:
        return swiglu(x, w, f"{prefix}{e}.")
    gate, up = np.split(x @ fused[e].T, 2, axis=-1)
    return (silu(gate) * up) @ w[prefix + "down_proj"][e].T


def rotate(x: np.ndarray, angles: np.ndarray, interleaved: bool) -> np.ndarray:
    """x [T, heads, D], angles [T, D / 2]. Rotate-half pairs dim i with dim i + D/2;
    interleaved (ERNIE-4.5) pairs dim 2i with 2i + 1."""
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    out = np.empty_like(x)
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = odd * cos + even * sin
    else:
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        out[..., :half] = first * cos - second * sin
        out[..., half:] = second * cos + first * sin
    return out


def is_moe_layer(config: Mapping[str, Any], index: int) -> bool:
    if config["architectures"][0] not in ("Ernie4_5_MoeForCausalLM", "Ernie4_5MoeForCausalLM"):
        return False
    end = config.get("moe_layer_end_index", -1)
    end = config["num_hidden_layers"] - 1 if end == -1 else end
    return (index + 1) % config.get("moe_layer_interval", 1) == 0 and config.get(
        "moe_layer_start_index", 1
    ) <= index <= end


def moe_block(
    x: np.ndarray, w: Mapping[str, np.ndarray], prefix: str, config: Mapping[str, Any]
) -> np.ndarray:
    """Softmax router; the top k of softmax + correction bias are chosen; their softmax
    weights renormalised (sum clamped at moe_norm_min); shared experts always added."""
    probs = softmax(x @ w[prefix + "gate.weight"].T)
    bias_key = "moe_statics.e_score_correction_bias"  # transformers 5 puts it in the gate
    bias = w.get(prefix + bias_key, w.get(prefix + "gate." + bias_key)).reshape(-1)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        chosen = np.argsort(-(probs[t] + bias), kind="stable")[: config["moe_k"]]
        weights = probs[t, chosen] / max(probs[t, chosen].sum(), config.get("moe_norm_min", 1e-12))
        for e, weight in zip(chosen, weights, strict=True):
            out[t] += weight * expert(x[t : t + 1], w, prefix + "experts.", e)[0]
    if config.get("moe_num_shared_experts", 0):
        out += swiglu(x, w, prefix + "shared_experts.")
    return out


def forward(
    config: Mapping[str, Any], w: Mapping[str, np.ndarray], ids: Sequence[int]
) -> np.ndarray:
    """Logits [len(ids), vocab] at every position of one sequence."""
    arch = config["architectures"][0]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    eps = config["rms_norm_eps"]
    interleaved = arch.startswith("Ernie4_5")
    n = len(ids)
    angles = np.outer(np.arange(n, dtype=np.float64), inverse_frequencies(config, head_dim))
    causal = np.tril(np.ones((n, n), dtype=bool))

    h = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = linear(x, w, p + "self_attn.q_proj").reshape(n, heads, head_dim)
        k = linear(x, w, p + "self_attn.k_proj").reshape(n, kv_heads, head_dim)
        v = linear(x, w, p + "self_attn.v_proj").reshape(n, kv_heads, head_dim)
        if arch == "Qwen3ForCausalLM":  # RMSNorm over each head, before rotary
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate(q, angles, interleaved), rotate(k, angles, interleaved)
        attended = np.empty((n, heads, head_dim))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head] @ k[:, kv].T / math.sqrt(head_dim)
            scores = np.where(causal, scores, -np.inf)
            attended[:, head] = softmax(scores) @ v[:, kv]
        h = h + linear(attended.reshape(n, heads * head_dim), w, p + "self_attn.o_proj")
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + (
            moe_block(x, w, p + "mlp.", config)
            if is_moe_layer(config, i)
            else swiglu(x, w, p + "mlp.")
        )
    h = rms_norm(h, w["model.norm.weight"], eps)
    tied = config.get("tie_word_embeddings", arch.startswith("Ernie4_5"))
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    logits = h @ head.T
    return logits + w["lm_head.bias"] if "lm_head.bias" in w else logits
