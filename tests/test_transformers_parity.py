"""Folders written by transformers' own save_pretrained, served here, against its generate().

Optional: skipped where transformers (and PyTorch) are not installed. Each architecture's
transformers class makes a tiny model, its weights redrawn so that logits are well spread
(greedy choices far from ties), saves it (MoE experts in transformers' original per-expert
format and in its fused one), and the engine's greedy tokens must equal generate()'s.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np
import pytest

from tests.helpers import serve
from tests.test_checkpoint import BOS, EOS, PAD, write_tokenizer

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
}
MOE = {
    "num_hidden_layers": 3,
    "moe_num_experts": 4,
    "moe_k": 2,
    "moe_intermediate_size": 32,
    "moe_num_shared_experts": 1,
}


class Case(NamedTuple):
    classes: str  # transformers' {classes}Config and {classes}ForCausalLM
    fields: dict
    original_format: bool = True  # save_pretrained's save_original_format
    name: str | None = None  # another architecture name to write to config.json


CASES = {
    "llama": Case("Llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}),
    "mistral": Case("Mistral", {"sliding_window": None, "head_dim": 8}),
    "qwen2": Case("Qwen2", {"tie_word_embeddings": True}),
    "qwen3": Case("Qwen3", {"head_dim": 32}),
    "ernie-4.5": Case("Ernie4_5", {"head_dim": 16, "use_bias": True}),
    "ernie-4.5, Baidu's name": Case("Ernie4_5", {"head_dim": 16}, name="Ernie4_5_ForCausalLM"),
    "ernie-4.5 moe, per expert": Case("Ernie4_5_Moe", MOE),
    "ernie-4.5 moe, fused": Case("Ernie4_5_Moe", MOE, original_format=False),
    "ernie-4.5 moe, fused, other name": Case(
        "Ernie4_5_Moe", MOE, original_format=False, name="Ernie4_5MoeForCausalLM"
    ),
}


def redraw(torch, model, seed: int = 0) -> None:
    """Weights spread like a trained model's scale: norms near one, projections at
    1/sqrt(fan_in), unit embeddings and router."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            if "norm" in name:
                values = 1.0 + rng.normal(0, 0.1, shape)
            elif "correction_bias" in name:
                values = rng.normal(0, 0.05, shape)
            elif name.endswith("bias"):
                values = rng.normal(0, 0.1, shape)
            elif "embed_tokens" in name or name.endswith("mlp.gate.weight"):
                values = rng.normal(0, 1.0, shape)
            else:
                values = rng.normal(0, shape[-1] ** -0.5, shape)
            param.copy_(torch.from_numpy(values.astype(np.float32)))


def save(tmp_path, case: Case, torch, transformers):
    folder = tmp_path / "model"
    folder.mkdir()
    vocab = write_tokenizer(folder, bos_template=False) + 6
    config = getattr(transformers, f"{case.classes}Config")(
        **{**SHAPE, **case.fields}, vocab_size=vocab
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{case.classes}ForCausalLM")(config).eval()
    redraw(torch, model)
    model.save_pretrained(folder, save_original_format=case.original_format)
    if case.name is not None:  # the same tensors under another folder's name
        written = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**written, "architectures": [case.name]}))
    return folder, model


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_greedy_tokens_match_transformers_generate(tmp_path, case, torch, transformers):
    folder, model = save(tmp_path, CASES[case], torch, transformers)
    if "fused" in case:
        with open(folder / "model.safetensors", "rb") as f:
            assert b"mlp.experts.gate_up_proj" in f.read(1 << 16)
    got, _ = serve(["model=hf", f"model.path={folder}", "tokenizer=hf", "max_tokens=32"])
    model.generation_config.eos_token_id = None  # served with EOS ignored
    for rid, request in got.items():
        n = len(request.output_ids)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([request.prompt_ids]),
                attention_mask=torch.ones(1, len(request.prompt_ids), dtype=torch.long),
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=PAD,
            )
        assert out[0, len(request.prompt_ids) :].tolist() == request.output_ids, rid
