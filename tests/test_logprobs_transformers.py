"""Logprobs through the server against transformers: a tiny model saved by transformers'
save_pretrained, served with `model=hf` (and a tiny GGUF, `model=gguf`, that transformers
reads with from_pretrained(gguf_file=...)), asked for its prompt's log-probabilities (echo)
and its output's (logprobs=5); each value must equal torch.log_softmax of transformers'
float32 logits on the same token ids within 1e-4 (the engine computes in float32 on CPU).

Optional: skipped where transformers (and PyTorch) are not installed (the `peer` extra).
The prompt is longer than the server's step budget, so its prefill runs in chunks.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.test_serve import AUTH, KEY, running_server
from tests.test_transformers_parity import CASES, save

PROMPT = "Paged attention keeps the block cache warm " * 4
OUTPUTS = 4
TOP = 5
TOLERANCE = 1e-4
STEP = 32  # max_tokens: the server's step budget, shorter than the prompt


def transformers_logprobs(torch, model, ids: list[int]):
    """Row i: torch.log_softmax of transformers' float32 logits after ids[: i + 1]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))).logits
    return torch.log_softmax(logits[0].float(), dim=-1)


def greedy(torch, model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                             max_new_tokens=OUTPUTS, do_sample=False, eos_token_id=None,
                             pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def expected_top(row, token: int, decode) -> dict[str, float]:
    """The reply's `top_logprobs` entry as the server builds it: the TOP most likely ids in
    order, then the scored one, keyed by their text (a later same text overwrites)."""
    ids = row.argsort(descending=True, stable=True)[:TOP].tolist()
    ids += [] if token in ids else [token]
    return {decode([t]): float(row[t]) for t in ids}


def differences(reply: dict, ids: list[int], rows, decode) -> list[float]:
    """|server - transformers| over every scored value and every top_logprobs value."""
    lp = reply["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None
    assert lp["tokens"] == [decode([t]) for t in ids]
    gaps: list[float] = []
    for i, token in enumerate(ids[1:]):
        row = rows[i]
        gaps.append(abs(lp["token_logprobs"][i + 1] - float(row[token])))
        top, expected = lp["top_logprobs"][i + 1], expected_top(row, token, decode)
        assert top.keys() == expected.keys(), i
        gaps += [abs(top[text] - expected[text]) for text in expected]
    return gaps


def gguf_model(tmp_path, torch, transformers):
    """A tiny llama GGUF (quantised attention and MLP tensors) and transformers' reading of
    it, dequantised to float32."""
    pytest.importorskip("accelerate", reason="optional: the `peer` extra (accelerate)")
    from tests.gguf_files import T, hf_weights, model_config, train_vocab, write_model

    vocab = train_vocab()
    config = model_config("LlamaForCausalLM", vocab.get_vocab_size(), tied=False)
    rng = np.random.default_rng(0)
    types = {"attn_q.weight": T.Q4_K, "attn_k.weight": T.Q8_0, "ffn_up.weight": T.Q6_K}
    path = tmp_path / "tiny.gguf"
    write_model(path, config, hf_weights(config, rng), types, vocab, rng)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    return ["model=gguf", f"model.path={path}"], model


def served_model(tmp_path, case: str, torch, transformers):
    """The overrides that serve the case's model, and transformers' own model of it."""
    if case == "gguf":
        return gguf_model(tmp_path, torch, transformers)
    folder, model = save(tmp_path, CASES[case], torch, transformers)
    return ["model=hf", f"model.path={folder}", "tokenizer=hf"], model


@pytest.mark.parametrize("case", ["llama", "qwen2", "gguf"])
def test_logprobs_equal_transformers_log_softmax(tmp_path, case, torch, transformers):
    model_overrides, model = served_model(tmp_path, case, torch, transformers)
    overrides = [*model_overrides, f"max_tokens={STEP}", "max_num_seqs=2",
                 f"serve.api_key={KEY}"]  # fmt: skip
    (tmp_path / "serve").mkdir()
    with running_server(overrides, tmp_path / "serve") as (url, worker):
        tokenizer = worker.engine.tokenizer
        prompt = tokenizer.encode(PROMPT)
        assert len(prompt) > 2 * STEP  # prefill over several chunks
        body = {"prompt": [prompt], "echo": True, "logprobs": TOP, "max_tokens": OUTPUTS,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        reply = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=300)
    assert reply.status_code == 200, reply.text
    ids = prompt + greedy(torch, model, prompt)
    rows = transformers_logprobs(torch, model, ids)
    gaps = differences(reply.json(), ids, rows, tokenizer.decode)
    print(f"{case}: {len(gaps)} values, max |server - transformers| = {max(gaps):.2e}")
    assert max(gaps) <= TOLERANCE
