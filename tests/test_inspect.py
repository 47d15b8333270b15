"""`python -m pipeline.inspect`: tiny folders whose figures are counted by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pipeline import inspect
from tests.test_checkpoint import (
    BOS,
    END_OF_TURN,
    EOS,
    MOE,
    PAD,
    base_config,
    hf_weights,
    write_checkpoint,
    write_tokenizer,
)

# base_config: hidden 64, intermediate 96, 2 layers, 4 heads of 16, 2 KV heads, vocab 40.
# A layer: two norms 2 * 64; q and o 64 * 64 each; k and v 32 * 64 each; the MLP 3 * 64 * 96.
LAYER = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 96  # 30,848
LLAMA_PARAMETERS = 40 * 64 + 2 * LAYER + 64 + 40 * 64  # embeddings, layers, norm, lm_head
# MOE: 3 layers, the first dense; layers 1 and 2 route to 4 experts (2 a token) of
# intermediate 32 with a router [4, 64], a correction bias [1, 4] and one shared expert.
ATTENTION = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64
EXPERT = 3 * 64 * 32
MOE_LAYER = ATTENTION + 4 * 64 + 4 + 4 * EXPERT + EXPERT
MOE_PARAMETERS = 40 * 64 + (ATTENTION + 3 * 64 * 96) + 2 * MOE_LAYER + 64  # tied: no lm_head
MOE_ACTIVE = MOE_PARAMETERS - 2 * (4 - 2) * EXPERT


def folder_of(tmp_path, architecture="LlamaForCausalLM", fused=False, dtype="float32", **fields):
    config = base_config(architecture, 40, **fields)
    folder = tmp_path / "model"
    weights = hf_weights(config, np.random.default_rng(0), fused_experts=fused)
    write_checkpoint(folder, config, weights, dtype, shards=2)
    return folder


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = inspect.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_llama_figures_and_the_json_document(tmp_path, capsys):
    assert LLAMA_PARAMETERS == 66_880
    folder = folder_of(tmp_path, dtype="bfloat16", rope_scaling={"type": "linear", "factor": 2.0})
    code, out, _ = run(capsys, folder, "--json")
    report = json.loads(out)
    assert code == 0 and report["servable"] and report["reason"] is None
    assert report["parameters"] == LLAMA_PARAMETERS
    assert report["tensors"] == 1 + 2 * 9 + 2 and report["stored_dtypes"] == {"BF16": 21}
    figures = {k: report[k] for k in ("num_hidden_layers", "num_attention_heads", "head_dim")}
    assert figures == {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}
    assert report["num_key_value_heads"] == 2 and report["max_position_embeddings"] == 512
    assert report["rope_scaling"] == "linear" and report["moe"] is None
    code, text, _ = run(capsys, folder)
    assert code == 0 and "servable      yes" in text and "66,880 in 21 tensors" in text
    assert "4 heads, 2 KV heads, head_dim 16" in text


@pytest.mark.parametrize("fused", [False, True], ids=["per expert", "fused"])
def test_moe_figures_count_every_expert_and_the_active_ones(tmp_path, capsys, fused):
    folder = folder_of(tmp_path, "Ernie4_5_MoeForCausalLM", fused, **MOE)
    code, out, _ = run(capsys, folder, "--json")
    report = json.loads(out)
    assert code == 0 and report["parameters"] == MOE_PARAMETERS == 120_264
    moe = report["moe"]
    assert moe["active_parameters"] == MOE_ACTIVE == 95_688
    assert moe["experts"] == 4 and moe["top_k"] == 2 and moe["moe_layers"] == [1, 2]
    assert moe["experts_stored"] == ("fused" if fused else "per expert")
    _, text, _ = run(capsys, folder)
    assert "in 2 of 3 layers" in text and "95,688 parameters active per token" in text


def test_special_tokens_with_their_text(tmp_path, capsys):
    folder = folder_of(tmp_path)
    write_tokenizer(folder, bos_template=True)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, END_OF_TURN]}))
    code, out, _ = run(capsys, folder, "--json")
    specials = json.loads(out)["special_tokens"]
    assert specials["bos"] == {"id": BOS, "token": "<s>"}
    assert specials["pad"] == {"id": PAD, "token": "<pad>"}
    assert specials["eos"] == [{"id": EOS, "token": "</s>"}, {"id": END_OF_TURN, "token": "<eot>"}]
    _, text, _ = run(capsys, folder)
    assert "BOS 1 <s>; EOS 2 </s>, 4 <eot>; PAD 3 <pad>" in text


def test_weights_are_not_read_nor_the_model_built(tmp_path, capsys, monkeypatch):
    """Only the headers: with weight reading and model building made to fail, the folder
    is still described in full. A shard cut short is refused, as loading would refuse it."""
    import stages.loading.checkpoint.reading
    import stages.model.transformer

    def fail(*args, **kwargs):
        raise AssertionError("inspect read weights or built the model")

    monkeypatch.setattr(stages.loading.checkpoint.reading, "_row_blocks", fail)
    monkeypatch.setattr(stages.model.transformer.TransformerLM, "__init__", fail)
    folder = folder_of(tmp_path)
    code, out, _ = run(capsys, folder, "--json")
    assert code == 0 and json.loads(out)["parameters"] == LLAMA_PARAMETERS
    shard = folder / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    code, out, _ = run(capsys, folder, "--json")
    assert code == 1 and "is not a readable safetensors file" in json.loads(out)["reason"]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"architectures": ["GPT2LMHeadModel"]},
            "config.json: architecture 'GPT2LMHeadModel' is not supported",
        ),
        (
            {"architectures": ["MistralForCausalLM"], "sliding_window": 256},
            "sliding_window=256 is smaller than the context of 512 tokens",
        ),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
    ],
)
def test_a_model_it_cannot_serve_exits_1_with_the_reason(tmp_path, capsys, fields, reason):
    folder = folder_of(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    code, out, _ = run(capsys, folder, "--json")
    report = json.loads(out)
    assert code == 1 and not report["servable"] and reason in report["reason"]
    assert "\n" not in report["reason"]
    assert report["parameters"] == LLAMA_PARAMETERS and report["num_hidden_layers"] == 2
    _, text, _ = run(capsys, folder)
    assert f"servable      no: {report['reason']}" in text


def test_the_served_context_decides_a_sliding_window(tmp_path, capsys):
    folder = folder_of(tmp_path, "MistralForCausalLM", sliding_window=256)
    assert run(capsys, folder)[0] == 1
    assert run(capsys, folder, "--max-model-len", "256")[0] == 0


def test_a_missing_weight_is_named(tmp_path, capsys):
    folder = folder_of(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    code, out, _ = run(capsys, folder, "--json")
    assert code == 1
    assert json.loads(out)["reason"].startswith("weight model.layers.2.")


def test_a_folder_that_is_not_a_model_exits_2(tmp_path, capsys):
    code, out, err = run(capsys, tmp_path / "nowhere")
    assert code == 2 and not out and err.strip().endswith("no such folder")
    code, _, err = run(capsys, tmp_path)
    assert code == 2 and err.strip() == f"Error: {tmp_path / 'config.json'} is missing"
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run(capsys, tmp_path)
    assert code == 2 and "is not valid JSON" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_command_line(tmp_path):
    folder = folder_of(tmp_path, "Qwen3ForCausalLM")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.inspect", str(folder)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "architecture  Qwen3ForCausalLM" in result.stdout
    assert "head_dim 16, q/k norm" in result.stdout


def test_a_config_only_folder_is_counted_from_its_config(tmp_path, capsys):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(base_config("LlamaForCausalLM", 40)))
    code, out, _ = run(capsys, folder, "--json")
    report = json.loads(out)
    assert code == 1 and not report["servable"]
    assert report["parameters"] == LLAMA_PARAMETERS and report["parameters_from"] == "config"
    assert report["reason"].startswith("no weights: servable only with executor=simulated")
    assert report["tokenizers"] == ["byte"]
    code, out, _ = run(capsys, folder)
    assert f"{LLAMA_PARAMETERS:,}, counted from config.json" in out
    assert "tokenizer=byte only: no tokenizer.json" in out


def test_the_tokenizer_options_follow_tokenizer_json(tmp_path, capsys):
    folder = folder_of(tmp_path)
    assert json.loads(run(capsys, folder, "--json")[1])["tokenizers"] == ["byte"]
    write_tokenizer(folder, False)
    assert json.loads(run(capsys, folder, "--json")[1])["tokenizers"] == ["hf", "byte"]
