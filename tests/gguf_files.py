"""Tiny GGUF files written with the `gguf` package's own GGUFWriter, for the tests.

Weights start as Hugging Face tensors ([out, in] Linear weights, by HF name); each is
stored in a chosen ggml type, quantised by gguf.quants (F16, BF16, Q8_0, Q4_0, Q4_1) or, for
the K-quants, which gguf.quants cannot quantise, drawn as random blocks with sane scales.
The expected weights (the oracle's) are what gguf.quants.dequantize reads back, in HF
layout; llama query / key rows are stored reordered as llama.cpp's converter does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from stages.workload.prompt_text import WORDS

T = gguf.GGMLQuantizationType
# Byte offsets and base magnitudes of each K-quant block's float16 scales (d, then dmin).
_K_SCALES = {T.Q4_K: ((0, 4e-4), (2, 3e-3)), T.Q5_K: ((0, 2e-4), (2, 3e-3)), T.Q6_K: ((208, 6e-5),)}


def random_blocks(rng: np.random.Generator, kind: T, rows: int, cols: int) -> np.ndarray:
    """Random K-quant rows [rows, bytes] whose float16 scales are small positive numbers."""
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset, base in _K_SCALES[kind]:
        scales = (base * rng.uniform(0.5, 1.5, size=len(raw))).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def store(array: np.ndarray, kind: T, rng: np.random.Generator) -> np.ndarray:
    """The array as GGUF stores it in `kind` (float arrays, or uint8 block rows)."""
    if kind == T.F32:
        return array.astype(np.float32)
    if kind == T.F16:
        return array.astype(np.float16)
    if kind in _K_SCALES:
        return random_blocks(rng, kind, int(np.prod(array.shape[:-1])), array.shape[-1])
    return quantize(array.astype(np.float32), kind)


def read_back(stored: np.ndarray, kind: T, shape: tuple[int, ...]) -> np.ndarray:
    """What the stored tensor holds, by gguf.quants (the independent dequantiser), float64."""
    if kind in (T.F32, T.F16):
        return stored.astype(np.float64).reshape(shape)
    return dequantize(stored, kind).astype(np.float64).reshape(shape)


def llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for query / key weights (convert_hf_to_gguf.py)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf: str) -> str:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}"


def hf_weights(config: Mapping, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random HF-named weights for a llama / qwen2 / qwen3 config (float32)."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = h // heads
    arch = config["architectures"][0]
    w = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, h))}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (heads * d, h),
            "self_attn.k_proj.weight": (kv * d, h),
            "self_attn.v_proj.weight": (kv * d, h),
            "self_attn.o_proj.weight": (h, heads * d),
            "mlp.gate_proj.weight": (inter, h),
            "mlp.up_proj.weight": (inter, h),
            "mlp.down_proj.weight": (h, inter),
        }
        for name, shape in shapes.items():
            w[p + name] = rng.normal(0, shape[1] ** -0.5, shape)
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            w[p + name] = rng.uniform(0.8, 1.2, h)
        if arch == "Qwen2ForCausalLM":
            for name, width in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
                w[p + f"self_attn.{name}.bias"] = rng.normal(0, 0.1, width)
        if arch == "Qwen3ForCausalLM":
            w[p + "self_attn.q_norm.weight"] = rng.uniform(0.8, 1.2, d)
            w[p + "self_attn.k_norm.weight"] = rng.uniform(0.8, 1.2, d)
    w["model.norm.weight"] = rng.uniform(0.8, 1.2, h)
    if not config.get("tie_word_embeddings"):
        w["lm_head.weight"] = rng.normal(0, h**-0.5, (vocab, h))
    return {k: v.astype(np.float32) for k, v in w.items()}


def train_vocab(size: int = 300) -> Tokenizer:
    """A byte-level BPE trained on the synthetic workload's words, SmolLM2's way of splitting
    (digits one by one, then GPT-2's regex), with chat markers as special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = " ".join(WORDS) + " 0123456789 Hello, world! It's 2026."
    tokenizer.train_from_iterator([text] * 4, trainer)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def add_gpt2_vocab(
    writer: gguf.GGUFWriter, tokenizer: Tokenizer, pre: str = "smollm", template: str = CHATML
) -> None:
    """The trained tokenizer's vocabulary and merges as tokenizer.ggml.* (gpt2 style)."""
    import json

    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(template)


def write_model(
    path: Path,
    config: Mapping,
    weights: Mapping[str, np.ndarray],
    types: Mapping[str, T],
    tokenizer: Tokenizer,
    rng: np.random.Generator,
    template: str = CHATML,
    name: str | None = None,
) -> dict[str, np.ndarray]:
    """Writes the model as GGUF; `types` maps a GGUF name's last part ("attn_q.weight") to
    its type (F32 otherwise); `template` is its chat template, `name` its general.name.
    Returns the weights the file holds, HF-named, float64."""
    arch = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[
        config["architectures"][0]
    ]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    if name:
        writer.add_name(name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    add_gpt2_vocab(writer, tokenizer, template=template)
    expected = {}
    for hf, array in weights.items():
        name = gguf_name(hf)
        kind = types.get(name.split(".", 2)[-1] if name.startswith("blk.") else name, T.F32)
        stored = store(array, kind, rng)
        held = read_back(stored, kind, array.shape)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            # The file holds the reordered rows; the oracle takes them in HF order.
            count = heads if name.endswith("attn_q.weight") else kv
            stored = llama_permute(stored, count)
        expected[hf] = held
        if kind in (T.F32, T.F16):
            writer.add_tensor(name, stored)
        else:
            writer.add_tensor(name, stored, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def model_config(arch: str, vocab: int, tied: bool) -> dict:
    """A two-layer config.json of `arch` the GGUF tests write their files from."""
    return {
        "architectures": [arch],
        "vocab_size": vocab,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
    }
