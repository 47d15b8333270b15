"""A tiny GGUF read by transformers' own GGUF loader (from_pretrained(gguf_file=...)) and
by this engine: the greedy tokens must agree, and so must both tokenizers.

Optional: skipped where transformers, PyTorch or accelerate are not installed (the `peer`
extra). transformers dequantises with gguf.quants and reorders llama's query / key rows
itself, so this checks the engine's reading of the file against an independent reader.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import serve
from tests.gguf_files import T, hf_weights, model_config, train_vocab, write_model


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_gguf_loading(tmp_path, torch, transformers):
    pytest.importorskip("accelerate", reason="optional: the `peer` extra (accelerate)")
    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), tied=False)
    rng = np.random.default_rng(0)
    types = {"attn_q.weight": T.Q4_K, "attn_k.weight": T.Q8_0, "ffn_up.weight": T.Q6_K}
    path = tmp_path / "tiny.gguf"
    write_model(path, config, hf_weights(config, rng), types, vocab, rng)
    lines = [
        {"id": f"r{i}", "prompt": text, "max_new_tokens": 8, "ignore_eos": True}
        for i, text in enumerate(["the block cache", "prefill decode chunk budget batch", "go"])
    ]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    overrides = ["model=gguf", f"model.path={path}", "workload=jsonl", f"workload.path={jsonl}"]
    got, _ = serve(overrides)

    folder, name = str(tmp_path), path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    ).eval()
    for line in lines:
        request = got[line["id"]]
        assert tokenizer.encode(line["prompt"], add_special_tokens=False) == request.prompt_ids
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([request.prompt_ids]),
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out[0, len(request.prompt_ids) :].tolist() == request.output_ids
