"""Hugging Face folders: tiny random checkpoints of each architecture, with the real key
names and shapes, served through the real pipeline and checked against a numpy forward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import paddle
import pytest
from safetensors.numpy import save_file
from safetensors.paddle import save_file as save_paddle
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from stages.loading.checkpoint import SUPPORTED_ARCHITECTURES, load_hf_model, read_spec
from stages.loading.checkpoint.export import export_hf_llama
from stages.model.transformer import check_dtype
from stages.workload.prompt_text import WORDS
from tests import numpy_reference
from tests.helpers import make_config, serve

UNK, BOS, EOS, PAD, END_OF_TURN = 0, 1, 2, 3, 4
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<eot>"]


def write_tokenizer(folder: Path, bos_template: bool) -> int:
    """A small BPE trained in memory on the synthetic workload's words; returns its size."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS, show_progress=False)
    tokenizer.train_from_iterator([" ".join(WORDS)] * 4, trainer)
    if bos_template:  # Llama-style: tokenizer.json itself puts BOS first
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", BOS)]
        )
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size(with_added_tokens=True)


def base_config(architecture: str, vocab_size: int, **extra) -> dict:
    return {
        "architectures": [architecture],
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        **extra,
    }


def hf_weights(
    config: dict, rng: np.random.Generator, fused_experts: bool = False
) -> dict[str, np.ndarray]:
    """Random tensors under the HF names and [out, in] shapes of the config's architecture;
    MoE experts per expert (Baidu's folders, transformers' original format) or fused, with
    the correction bias in the gate, as transformers 5 keeps them."""
    arch = config["architectures"][0]
    h, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    ernie = arch.startswith("Ernie4_5")
    ernie_bias = ernie and config.get("use_bias", False)
    qkv_bias = arch == "Qwen2ForCausalLM" or config.get("attention_bias") or ernie_bias
    out_bias = config.get("attention_bias") or ernie_bias
    mlp_bias = config.get("mlp_bias") or ernie_bias
    w: dict[str, np.ndarray] = {}

    def linear(name: str, out: int, inp: int, bias: bool) -> None:
        w[name + ".weight"] = rng.normal(0, inp**-0.5, (out, inp))
        if bias:
            w[name + ".bias"] = rng.normal(0, 0.2, out)

    def norm(name: str, size: int = h) -> None:
        w[name] = 1.0 + rng.normal(0, 0.1, size)

    def mlp(prefix: str, inter: int) -> None:
        linear(prefix + "gate_proj", inter, h, mlp_bias)
        linear(prefix + "up_proj", inter, h, mlp_bias)
        linear(prefix + "down_proj", h, inter, mlp_bias)

    w["model.embed_tokens.weight"] = rng.normal(0, 1, (vocab, h))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight")
        norm(p + "post_attention_layernorm.weight")
        linear(p + "self_attn.q_proj", heads * d, h, qkv_bias)
        linear(p + "self_attn.k_proj", kv_heads * d, h, qkv_bias)
        linear(p + "self_attn.v_proj", kv_heads * d, h, qkv_bias)
        linear(p + "self_attn.o_proj", h, heads * d, out_bias)
        if arch == "Qwen3ForCausalLM":
            norm(p + "self_attn.q_norm.weight", d)
            norm(p + "self_attn.k_norm.weight", d)
        if numpy_reference.is_moe_layer(config, i):
            moe_weights(w, config, p + "mlp.", rng, fused_experts, mlp)
        else:
            mlp(p + "mlp.", config["intermediate_size"])
    norm("model.norm.weight")
    if not config.get("tie_word_embeddings", ernie):
        linear("lm_head", vocab, h, arch == "Ernie4_5_MoeForCausalLM" and ernie_bias)
    return w


def moe_weights(w: dict, config: dict, prefix: str, rng, fused: bool, mlp) -> None:
    h, experts = config["hidden_size"], config["moe_num_experts"]
    inter = config["moe_intermediate_size"]
    w[prefix + "gate.weight"] = rng.normal(0, 1, (experts, h))
    bias = prefix + ("gate." if fused else "") + "moe_statics.e_score_correction_bias"
    w[bias] = rng.normal(0, 0.05, (1, experts))
    if fused:  # [experts, 2 * inter, hidden] (gate rows, then up) and [experts, hidden, inter]
        w[prefix + "experts.gate_up_proj"] = rng.normal(0, h**-0.5, (experts, 2 * inter, h))
        w[prefix + "experts.down_proj"] = rng.normal(0, inter**-0.5, (experts, h, inter))
    else:
        for e in range(experts):
            mlp(f"{prefix}experts.{e}.", inter)
    shared = config.get("moe_num_shared_experts", 0)
    if shared:
        mlp(prefix + "shared_experts.", inter * shared)


def stored(array: np.ndarray, dtype: str) -> np.ndarray:
    """The values a dtype keeps: what the loader and the reference both see."""
    if dtype == "bfloat16":
        return bf16(array).astype("float32").numpy().astype(np.float64)
    return array.astype(dtype).astype(np.float64)


def bf16(array: np.ndarray) -> paddle.Tensor:
    return paddle.to_tensor(array.astype(np.float32)).astype("bfloat16")


def write_checkpoint(
    folder: Path, config: dict, weights: dict[str, np.ndarray], dtype: str, shards: int = 1
) -> dict[str, np.ndarray]:
    """Writes config.json and the weights (one file, or `shards` files and an index);
    returns the weights as stored."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    kept = {k: stored(v, dtype) for k, v in weights.items()}
    names = list(kept)
    groups = [names[i::shards] for i in range(shards)]
    files = (
        ["model.safetensors"]
        if shards == 1
        else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    )
    for file, group in zip(files, groups, strict=True):
        part = {k: kept[k] for k in group}
        if dtype == "bfloat16":  # numpy has no bfloat16: Paddle tensors
            save_paddle({k: bf16(v) for k, v in part.items()}, str(folder / file))
        else:
            save_file({k: v.astype(dtype) for k, v in part.items()}, str(folder / file))
    if shards > 1:
        weight_map = {k: file for file, group in zip(files, groups, strict=True) for k in group}
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return kept


MOE = {
    "num_hidden_layers": 3,
    "moe_num_experts": 4,
    "moe_k": 2,
    "moe_intermediate_size": 32,
    "moe_num_shared_experts": 1,
    "moe_layer_start_index": 1,
    "moe_layer_end_index": -1,
    "moe_layer_interval": 1,
    "moe_norm_min": 1e-12,
    "use_bias": False,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@dataclass(frozen=True)
class Case:
    architecture: str
    fields: dict  # config.json beyond base_config
    dtype: str = "float32"  # stored
    shards: int = 1
    bos_template: bool = False  # the tokenizer puts BOS first
    fused_experts: bool = False
    attention: str = "hpu"


# transformers 5 writes rope_theta inside rope_parameters.
ROPE_PARAMETERS = {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}
CASES = {
    "llama, llama3 rope, fp32": Case(
        "LlamaForCausalLM", {"rope_scaling": LLAMA3_SCALING}, bos_template=True
    ),
    "llama, biases, linear rope, fp16": Case(
        "LlamaForCausalLM",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "rope_scaling": {"type": "linear", "factor": 2.0},
        },
        "float16",
        bos_template=True,
    ),
    "mistral, window beyond the context, head_dim 8": Case(
        "MistralForCausalLM", {"sliding_window": 4096, "head_dim": 8}, bos_template=True
    ),
    "qwen2, tied, sharded, bf16": Case(
        "Qwen2ForCausalLM", {"tie_word_embeddings": True, "rope_theta": 1e6}, "bfloat16", 2
    ),
    "qwen3, q/k norm, head_dim 32, tied": Case(
        "Qwen3ForCausalLM", {"head_dim": 32, "tie_word_embeddings": True, "rope_theta": 1e6}
    ),
    "qwen3, q/k norm, attention biases, bf16, reference attention": Case(
        "Qwen3ForCausalLM", {"attention_bias": True}, "bfloat16", attention="reference"
    ),
    "ernie-4.5 dense, head_dim 24, bf16": Case(
        "Ernie4_5_ForCausalLM",
        {"head_dim": 24, "use_bias": True, "rope_theta": 500000.0},
        "bfloat16",
    ),
    "ernie-4.5 dense, transformers' name, rope_parameters": Case(
        "Ernie4_5ForCausalLM", {"head_dim": 16, **ROPE_PARAMETERS}, "bfloat16"
    ),
    "ernie-4.5 moe, sharded": Case("Ernie4_5_MoeForCausalLM", MOE, shards=3),
    "ernie-4.5 moe, fused experts, sharded, bf16": Case(
        "Ernie4_5_MoeForCausalLM", {**MOE, **ROPE_PARAMETERS}, "bfloat16", 2, fused_experts=True
    ),
    "ernie-4.5 moe, other name, fused experts": Case(
        "Ernie4_5MoeForCausalLM", MOE, attention="reference", fused_experts=True
    ),
}


def make_folder(tmp_path: Path, name: str) -> tuple[Path, dict, dict[str, np.ndarray]]:
    case = CASES[name]
    folder = tmp_path / "model"
    folder.mkdir()
    vocab = write_tokenizer(folder, case.bos_template)
    # The vocabulary is padded past the tokenizer, as real ones are.
    config = base_config(case.architecture, vocab + 6, **case.fields)
    weights = hf_weights(config, np.random.default_rng(0), case.fused_experts)
    weights = write_checkpoint(folder, config, weights, case.dtype, case.shards)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, END_OF_TURN]}))
    return folder, config, weights


HF = ["tokenizer=hf", "max_tokens=32"]


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_checkpoint_logits_match_numpy_reference(tmp_path, case):
    folder, config, weights = make_folder(tmp_path, case)
    steps = []
    overrides = ["model=hf", f"model.path={folder}", f"attention={CASES[case].attention}", *HF]
    got, engine = serve(overrides, record_logits=True, steps=steps)
    assert any(c["start"] > 0 for s in steps for c in s.prefill), "no prompt was chunked"
    assert engine.scheduler.stop.eos_ids == {EOS, END_OF_TURN}
    worst = 0.0
    for rid, request in got.items():
        assert request.finish_reason == "length", request.error
        assert (request.prompt_ids[0] == BOS) == CASES[case].bos_template
        sequence = request.prompt_ids + request.output_ids[:-1]
        expected = numpy_reference.forward(config, weights, sequence)
        for j in range(len(request.output_ids)):
            row = engine.sampler.logits[(rid, j)]
            worst = max(worst, np.abs(row - expected[len(request.prompt_ids) - 1 + j]).max())
    assert worst < 1e-4


def test_moe_routes_tokens_to_several_experts(tmp_path):
    """The MoE comparison means something only if tokens do not all pick the same experts."""
    folder, config, weights = make_folder(tmp_path, "ernie-4.5 moe, sharded")
    x = np.random.default_rng(1).normal(size=(32, config["hidden_size"]))
    scores = numpy_reference.softmax(x @ weights["model.layers.1.mlp.gate.weight"].T)
    assert len({tuple(sorted(np.argsort(-s)[:2])) for s in scores}) >= 3


def test_export_round_trip_gives_identical_tokens(tmp_path):
    engine, _ = build_engine(make_config())
    export_hf_llama(engine.model, tmp_path, bos_token_id=256, eos_token_id=257)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    builtin, _ = serve()
    loaded, loaded_engine = serve(["model=hf", f"model.path={tmp_path}"])
    assert loaded_engine.model.num_parameters == engine.model.num_parameters
    for rid, request in builtin.items():
        assert loaded[rid].output_ids == request.output_ids, rid


def test_tokenizer_defaults_to_the_model_folder(tmp_path):
    folder, _, _ = make_folder(tmp_path, "llama, llama3 rope, fp32")
    cfg = make_config(["model=hf", f"model.path={folder}", "tokenizer=hf"])
    assert cfg.tokenizer.path == str(folder)
    engine, requests = build_engine(cfg)
    tokenizer = engine.tokenizer
    ids = tokenizer.encode("the block cache")
    assert ids[0] == BOS and len(ids) == 4
    assert tokenizer.decode(ids).split() == ["the", "block", "cache"]
    assert tokenizer.eos_ids == {EOS, END_OF_TURN} and tokenizer.pad_id == PAD


# --- what a folder can get wrong ------------------------------------------------------


def good_folder(tmp_path: Path, **config_changes) -> tuple[Path, dict]:
    config = base_config("LlamaForCausalLM", 40, **config_changes)
    folder = tmp_path / "model"
    write_checkpoint(folder, config, hf_weights(config, np.random.default_rng(0)), "float32")
    return folder, config


def expect_error(folder: Path, message: str) -> str:
    with pytest.raises(ValueError) as err:
        load_hf_model(str(folder), "float32", max_position=0)
    text = str(err.value)
    assert message in text and "\n" not in text
    return text


def test_missing_folder_and_config(tmp_path):
    expect_error(tmp_path / "nowhere", "no such folder")
    expect_error(tmp_path, "config.json is missing")


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    folder, config = good_folder(tmp_path, architectures=["GPT2LMHeadModel"])
    text = expect_error(folder, "'GPT2LMHeadModel' is not supported")
    assert all(name in text for name in SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize(
    ("names", "family"),
    [
        (["Ernie4_5_ForCausalLM", "Ernie4_5ForCausalLM"], "Ernie4_5_ForCausalLM"),
        (["Ernie4_5_MoeForCausalLM", "Ernie4_5MoeForCausalLM"], "Ernie4_5_MoeForCausalLM"),
    ],
)
def test_remote_code_and_transformers_names_read_alike(names, family):
    """Baidu's remote-code name and transformers' own give the same model."""
    specs = [read_spec(base_config(name, 40, **MOE)) for name in names]
    assert {s.family for s in specs} == {family}
    assert len({replace(s, architecture="") for s in specs}) == 1
    assert specs[0].rope_interleaved and specs[0].model.tied_embeddings


def test_fused_experts_misshapen_or_missing_are_named(tmp_path):
    config = base_config("Ernie4_5_MoeForCausalLM", 40, **MOE)
    folder = tmp_path / "model"
    weights = hf_weights(config, np.random.default_rng(0), fused_experts=True)
    down = "model.layers.2.mlp.experts.down_proj"
    weights[down] = weights[down].transpose(0, 2, 1)  # [experts, inter, hidden]
    write_checkpoint(folder, config, weights, "float32")
    expect_error(folder, f"weight {down} has shape [4, 32, 64], expected [4, 64, 32]")
    del weights[down]
    write_checkpoint(folder, config, weights, "float32")
    expect_error(folder, f"weight {down} is missing")


def test_a_sliding_window_covering_the_served_context_is_served(tmp_path):
    folder, _ = good_folder(tmp_path, architectures=["MistralForCausalLM"], sliding_window=256)
    expect_error(folder, "sliding_window=256 is smaller than the context of 512 tokens")
    model = load_hf_model(
        str(folder), "float32", max_position=256
    )  # max_model_len=256 fits the window
    assert model.max_position == 256


def test_hpu_ops_refuse_a_q_k_normed_model_at_start(tmp_path, monkeypatch):
    """The HPU's fused_qkv_rope has no per-head norm: a Qwen3 model is refused when the
    pipeline is built, in one line, before any step."""
    from pipeline.config import checks

    folder, _, _ = make_folder(tmp_path, "qwen3, q/k norm, head_dim 32, tied")
    monkeypatch.setitem(sys.modules, "paddlenlp_ops", object())  # a stand-in plugin
    monkeypatch.setattr(checks, "_hpu_plugin_present", lambda: True)
    monkeypatch.setattr(checks, "_hpu_ops_present", lambda: True)
    monkeypatch.setattr(paddle, "set_device", lambda device: None)  # no HPU here
    hpu = ["attention.ops=intel_hpu", "device=intel_hpu", *HF]
    with pytest.raises(ConfigError) as err:
        build_engine(make_config(["model=hf", f"model.path={folder}", *hpu]))
    message = str(err.value)
    assert message.startswith("attention.ops=intel_hpu has no fused q/k norm")
    assert message.endswith("set attention.ops=cpu") and "\n" not in message
    # A model without q/k norms is built on the same ops.
    (tmp_path / "llama").mkdir()
    folder, _, _ = make_folder(tmp_path / "llama", "llama, llama3 rope, fp32")
    engine, _ = build_engine(make_config(["model=hf", f"model.path={folder}", *hpu]))
    assert type(engine.attention.ops).__name__ == "IntelHPUOps"


def test_missing_and_misshapen_weights_are_named(tmp_path):
    folder, config = good_folder(tmp_path)
    weights = hf_weights(config, np.random.default_rng(0))
    del weights["model.layers.1.self_attn.k_proj.weight"]
    write_checkpoint(folder, config, weights, "float32")
    expect_error(folder, "weight model.layers.1.self_attn.k_proj.weight is missing")

    weights = hf_weights(config, np.random.default_rng(0))
    weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"].T
    write_checkpoint(folder, config, weights, "float32")
    expect_error(
        folder, "weight model.layers.0.mlp.up_proj.weight has shape [64, 96], expected [96, 64]"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"num_key_value_heads": 3},
            "num_attention_heads=4 is not a multiple of num_key_value_heads=3",
        ),
        ({"hidden_size": 0}, "hidden_size=0 is out of range"),
        ({"rms_norm_eps": -1}, "rms_norm_eps=-1 is out of range"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling type 'yarn' is not supported: choose one of default, linear, llama3",
        ),
        ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling.factor=None"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        (
            {"architectures": ["Ernie4_5_MoeForCausalLM"], **MOE, "moe_k": 5},
            "moe_k=5 is out of range",
        ),
        (
            {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True},
            "use_sliding_window=true is not supported",
        ),
        (
            {"architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True},
            "use_sliding_window=true is not supported",
        ),
        (
            {"architectures": ["MistralForCausalLM"], "sliding_window": 128},
            "config.json: sliding_window=128 is smaller than the context of 512 tokens, and "
            "every layer attends to the whole context here: lower max_model_len to at most 128",
        ),
        (
            {"architectures": ["MistralForCausalLM"], "sliding_window": 0},
            "sliding_window=0 is out of range",
        ),
    ],
)
def test_config_fields_out_of_range(tmp_path, change, message):
    folder, config = good_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    expect_error(folder, message)


def test_quantised_weights_are_refused(tmp_path):
    folder, config = good_folder(tmp_path)
    weights = hf_weights(config, np.random.default_rng(0))
    tensors = {k: v.astype(np.float32) for k, v in weights.items()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.int8)
    save_file(tensors, str(folder / "model.safetensors"))
    expect_error(folder, "weight model.norm.weight is stored as I8: supported are F32, F16, BF16")


def test_pickle_weights_are_refused_without_being_read(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(base_config("LlamaForCausalLM", 40)))
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle")
    text = expect_error(folder, "weights only as pytorch_model.bin")
    assert "unpickled" in text and "safetensors" in text


def test_missing_shard_named_by_the_index(tmp_path):
    folder, config = good_folder(tmp_path)
    write_checkpoint(folder, config, hf_weights(config, np.random.default_rng(0)), "float32", 2)
    (folder / "model.safetensors").unlink()
    (folder / "model-00002-of-00002.safetensors").unlink()
    expect_error(
        folder, "model-00002-of-00002.safetensors is missing (named by model.safetensors.index.json"
    )


def test_max_model_len_beyond_the_model(tmp_path):
    folder, _ = good_folder(tmp_path)
    with pytest.raises(
        ValueError, match="max_model_len=4096 is above the model's max_position_embeddings=512"
    ):
        load_hf_model(str(folder), "float32", max_position=4096)


def test_half_precision_compute_is_refused_where_paddle_has_no_kernel():
    try:
        check_dtype("bfloat16")
    except ValueError as err:
        assert "use model.dtype=float32" in str(err)
    with pytest.raises(
        ValueError, match="model.dtype=int8: choose one of float32, float16, bfloat16"
    ):
        check_dtype("int8")


@pytest.mark.slow
def test_command_line_error_is_one_line_with_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", f"hydra.run.dir={tmp_path}", "model=hf",
         f"model.path={tmp_path / 'nowhere'}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"Error: model.path={tmp_path / 'nowhere'}: no such folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_tokenizer_json_missing(tmp_path):
    folder, _ = good_folder(tmp_path)
    (folder / "tokenizer.model").write_bytes(b"")
    with pytest.raises(ValueError, match=r"tokenizer.json is missing: .*found tokenizer.model"):
        serve(["model=hf", f"model.path={folder}", "tokenizer=hf"])


def test_folder_keys_must_be_given():
    with pytest.raises(ConfigError, match=r"^model.path is not set: give model.path=\.\.\.$"):
        build_engine(make_config(["model=hf"]))
    with pytest.raises(ConfigError, match=r"^tokenizer.path does not resolve \(Interpolation key"):
        build_engine(make_config(["tokenizer=hf"]))
