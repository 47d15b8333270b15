"""model=gguf: dequantisation against gguf.quants, logits against the numpy forward, the
file's tokenizer and chat template, and bad files refused in one line before any data."""

from __future__ import annotations

import json
import struct
import tracemalloc

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

from pipeline.inspect import main as inspect_main
from stages.loading.chat import render_chat
from stages.loading.gguf.config import gguf_spec
from stages.loading.gguf.loader import load_state
from stages.loading.gguf.quants import SUPPORTED_TYPES, dequantize
from stages.loading.gguf.reader import read_gguf_header
from stages.loading.gguf.tokenizer import GgufTokenizer
from stages.loading.tokenizer import ByteTokenizer, HfTokenizer
from tests import numpy_reference
from tests.gguf_files import CHATML, T, hf_weights, model_config, store, train_vocab, write_model
from tests.helpers import LIMITS, ONE_THREAD, run_cli, serve


@pytest.mark.parametrize("kind", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequantisation_matches_gguf_quants(kind):
    rng = np.random.default_rng(int(kind))
    values = rng.normal(0, 0.5, (8, 512)).astype(np.float32)
    stored = store(values, kind, rng)
    raw = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    theirs = gguf.quants.dequantize(stored, kind).reshape(-1)
    ours = dequantize(raw, kind)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs.astype(np.float32))
    assert np.abs(ours).max() > 0  # the case exercised real values


def test_unsupported_type_is_named():
    with pytest.raises(ValueError, match="Q2_K is not supported: supported are F32"):
        dequantize(np.zeros(GGML_QUANT_SIZES[T.Q2_K][1], np.uint8), T.Q2_K)


# Every supported type across the llama model's tensors; norms stay F32.
LLAMA_TYPES = {
    "token_embd.weight": T.Q8_0,
    "attn_q.weight": T.Q4_K,
    "attn_k.weight": T.Q5_K,
    "attn_v.weight": T.Q6_K,
    "attn_output.weight": T.Q4_0,
    "ffn_gate.weight": T.Q4_1,
    "ffn_up.weight": T.F16,
    "ffn_down.weight": T.BF16,
    "output.weight": T.Q6_K,
}
QWEN_TYPES = {"attn_q.weight": T.F16, "ffn_down.weight": T.Q8_0, "token_embd.weight": T.BF16}


@pytest.fixture(scope="module")
def vocab():
    return train_vocab()


def make_gguf(tmp_path, vocab, arch: str, types: dict, tied: bool = False):
    config = model_config(arch, vocab.get_vocab_size(), tied)
    rng = np.random.default_rng(0)
    path = tmp_path / f"{arch}.gguf"
    held = write_model(path, config, hf_weights(config, rng), types, vocab, rng)
    return path, config, held


# Prompts long enough to be chunked (max_tokens=16), few enough to take a second or two.
SHORT = ["workload.num_requests=3", "workload.max_prompt_tokens=40", "workload.max_new_tokens=4"]

CASES = {
    "llama, every type": ("LlamaForCausalLM", LLAMA_TYPES, False),
    "qwen2, biases, tied": ("Qwen2ForCausalLM", QWEN_TYPES, True),
    "qwen3, q/k norm": ("Qwen3ForCausalLM", QWEN_TYPES, False),
}
SLOW_CASES = {"qwen2, biases, tied", "qwen3, q/k norm"}  # the llama case runs every type


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW_CASES else []) for c in CASES]
)
def test_gguf_logits_match_numpy_reference(tmp_path, vocab, case):
    arch, types, tied = CASES[case]
    path, config, held = make_gguf(tmp_path, vocab, arch, types, tied)
    steps = []
    overrides = ["model=gguf", f"model.path={path}", "max_tokens=16", *SHORT]
    got, engine = serve(overrides, record_logits=True, steps=steps)
    assert any(c["start"] > 0 for s in steps for c in s.prefill), "no prompt was chunked"
    worst = 0.0
    for rid, request in got.items():
        assert request.finish_reason == "length", request.error
        sequence = request.prompt_ids + request.output_ids[:-1]
        expected = numpy_reference.forward(config, held, sequence)
        for j in range(len(request.output_ids)):
            row = engine.sampler.logits[(rid, j)]
            worst = max(worst, np.abs(row - expected[len(request.prompt_ids) - 1 + j]).max())
    assert worst < 1e-4


def test_loading_holds_one_tensor_beyond_the_model(tmp_path, vocab):
    """Streaming: numpy's peak while loading stays within 1.3x the dequantised model."""
    path, config, _ = make_gguf(tmp_path, vocab, "LlamaForCausalLM", LLAMA_TYPES)
    header = read_gguf_header(path)
    spec = gguf_spec(header)
    tracemalloc.start()
    state = load_state(header, spec, "float32")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    model_bytes = sum(int(np.prod(t.shape)) * 4 for t in state.values())
    assert peak <= 1.3 * model_bytes, (peak, model_bytes)


TEXTS = [
    "the block cache token prefill",
    "Hello, world! It's 2026 and 12345 apples.",
    "  two  spaces\nand a new line\t tab",
    "émigré 東京 🙂 unknown",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]


def test_gpt2_vocabulary_tokenizes_as_the_trained_tokenizer(tmp_path, vocab):
    path, _, _ = make_gguf(tmp_path, vocab, "Qwen2ForCausalLM", {}, tied=True)
    tokenizer = GgufTokenizer(str(path), add_bos=None)
    for text in TEXTS:
        expected = vocab.encode(text, add_special_tokens=False).ids
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected) == vocab.decode(expected), text
        if "<|" not in text:
            assert tokenizer.decode(expected) == text
    assert tokenizer.eos_ids == {2} and tokenizer.bos_id == 1 and tokenizer.pad_id == 0


def spm_reference(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    """llama.cpp's SentencePiece rule written plainly: "▁" for spaces and one in front, then
    merge the adjacent pair whose joined piece has the highest score (leftmost on ties)
    until none joins; pieces missing from the vocabulary become their bytes' tokens."""
    symbols = list("▁" + text.replace(" ", "▁"))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            joined = symbols[i] + symbols[i + 1]
            if joined in vocab and (best is None or scores[vocab[joined]] > best[0]):
                best = (scores[vocab[joined]], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    ids = []
    for s in symbols:
        if s in vocab:
            ids.append(vocab[s])
        else:
            ids.extend(vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
    return ids


def spm_vocabulary() -> tuple[list[str], list[float], list[int]]:
    pieces = ["▁", "t", "h", "e", "b", "l", "o", "c", "k", "a", "▁t", "th", "he", "▁th"]
    pieces += ["the", "▁the", "lo", "bl", "ck", "ock", "▁b", "▁bl", "▁block", "ch", "ca", "che"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    # Scores not in id order, so merge ranks come from the scores.
    rng = np.random.default_rng(3)
    scores = [0.0] * 259 + list(-rng.permutation(len(pieces)).astype(float))
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    return tokens, scores, types


def test_llama_vocabulary_tokenizes_as_sentencepiece_does(tmp_path):
    tokens, scores, types = spm_vocabulary()
    path = tmp_path / "spm.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tokenizer = GgufTokenizer(str(path), add_bos=None)
    vocab = {t: i for i, t in enumerate(tokens)}
    for text in ["the block", "lock the check", "the  cab", "blocked ", "thé clock"]:
        expected = [1, *spm_reference(text, vocab, scores)]
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected) == text, text


def test_chat_template_renders_in_the_sandbox():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = render_chat(CHATML, messages)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    for hostile in ("{{ messages.append(1) }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}"):
        with pytest.raises(ValueError, match="the chat template failed"):
            render_chat(hostile, messages)
    with pytest.raises(ValueError, match=r"messages\[0\].role='robot'"):
        render_chat(CHATML, [{"role": "robot", "content": "x"}])


def test_tokenizers_without_a_file_template_use_the_plain_one(tmp_path, vocab):
    messages = [{"role": "user", "content": "Hi"}]
    text, ids = ByteTokenizer(add_bos=True).encode_chat(messages)
    assert text == "<|user|>\nHi\n<|assistant|>\n"
    assert ids == ByteTokenizer(add_bos=True).encode(text)
    vocab.save(str(tmp_path / "tokenizer.json"))
    assert (
        HfTokenizer(str(tmp_path), add_special_tokens=True, add_bos=False).encode_chat(messages)[0]
        == text
    )
    config = {"chat_template": CHATML, "bos_token": {"content": "<|endoftext|>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text, ids = HfTokenizer(str(tmp_path), add_special_tokens=True, add_bos=False).encode_chat(
        messages
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert ids == vocab.encode(text, add_special_tokens=False).ids


def test_jsonl_messages_use_the_chat_template(tmp_path, vocab):
    path, _, _ = make_gguf(tmp_path, vocab, "Qwen2ForCausalLM", {}, tied=True)
    lines = [
        {"id": "chat", "messages": [{"role": "user", "content": "the cache"}], "max_new_tokens": 3},
        {"id": "both", "prompt": "x", "messages": [{"role": "user", "content": "y"}]},
        {"id": "plain", "prompt": "the block", "max_new_tokens": 3},
    ]
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    overrides = ["model=gguf", f"model.path={path}", "workload=jsonl", f"workload.path={jsonl}"]
    got, _ = serve(overrides)
    chat = got["chat"]
    assert chat.prompt == "<|im_start|>user\nthe cache<|im_end|>\n<|im_start|>assistant\n"
    assert chat.prompt_ids == vocab.encode(chat.prompt, add_special_tokens=False).ids
    assert chat.prompt_ids[0] == 1 and chat.finish_reason in ("length", "stop")
    assert "not both" in got["both"].error
    assert got["plain"].prompt_ids == vocab.encode("the block").ids


def write_raw(path, *parts: bytes) -> None:
    path.write_bytes(b"".join(parts))


def gguf_string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("magic", "is not a GGUF file"),
        ("huge tensor count", "the tensor count is 1,152,921,504,606,846,976"),
        ("huge metadata count", "the metadata count is"),
        ("huge string", "the length of a metadata key is"),
        ("truncated", "past the file's"),
        ("unknown architecture", "architecture 'gpt-j' is not supported: supported are llama"),
        ("shape disagrees", "its size disagrees with its shape"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, vocab, kind, message):
    path = tmp_path / "bad.gguf"
    version = struct.pack("<I", 3)
    if kind == "magic":
        write_raw(path, b"GGML", version, bytes(16))
    elif kind == "huge tensor count":
        write_raw(path, b"GGUF", version, struct.pack("<QQ", 1 << 60, 0))
    elif kind == "huge metadata count":
        write_raw(path, b"GGUF", version, struct.pack("<QQ", 0, 1 << 40))
    elif kind == "huge string":
        write_raw(path, b"GGUF", version, struct.pack("<QQQ", 0, 1, 1 << 50), bytes(32))
    elif kind == "truncated":
        good, _, _ = make_gguf(tmp_path, vocab, "Qwen2ForCausalLM", {}, tied=True)
        data = good.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "unknown architecture":
        writer = gguf.GGUFWriter(str(path), "gpt-j")
        writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    else:  # a tensor claiming more rows than its bytes hold
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_tensor("a", np.zeros((4, 32), np.float32), raw_shape=(6, 32))
        writer.add_tensor("b", np.zeros((4, 32), np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    tracemalloc.start()
    with pytest.raises(ValueError, match=message) as err:
        gguf_spec(read_gguf_header(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert "\n" not in str(err.value)
    assert peak < 16 << 20  # nothing the size of a claimed count was allocated


def test_inspect_reads_the_header(tmp_path, vocab, capsys):
    path, config, _ = make_gguf(tmp_path, vocab, "LlamaForCausalLM", LLAMA_TYPES)
    assert inspect_main([str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["servable"] and report["architecture"] == "llama"
    assert report["tensor_types"]["Q4_K"] == config["num_hidden_layers"]
    assert report["num_key_value_heads"] == 2 and report["chat_template"]
    assert report["special_tokens"]["eos"] == [{"id": 2, "token": "<|im_end|>"}]
    assert inspect_main([str(path), "--max-model-len", "4096"]) == 1
    assert "is above the model's max_position_embeddings=512 (LlamaForCausalLM.gguf)" in (
        capsys.readouterr().out
    )


@pytest.mark.slow
def test_command_line_serves_a_chat_and_refuses_a_bad_file(tmp_path, vocab):
    path, _, _ = make_gguf(tmp_path, vocab, "Qwen2ForCausalLM", {}, tied=True)
    chat = tmp_path / "chat.jsonl"
    line = {"id": "c", "messages": [{"role": "user", "content": "the cache"}], "max_new_tokens": 3}
    chat.write_text(json.dumps(line) + "\n")
    run = tmp_path / "run"
    args = ["model=gguf", f"model.path={path}", "workload=jsonl", f"workload.path={chat}"]
    args += [*LIMITS, ONE_THREAD]
    result = run_cli(tmp_path, "pipeline", f"hydra.run.dir={run}", *args)
    assert result.returncode == 0, result.stderr
    generation = json.loads((run / "generations.jsonl").read_text())
    assert generation["prompt"].startswith("<|im_start|>user\nthe cache<|im_end|>")
    assert generation["finish_reason"] in ("stop", "length") and generation["error"] is None
    bad = tmp_path / "bad.gguf"
    data = path.read_bytes()
    bad.write_bytes(data[: len(data) * 2 // 3])
    args[1] = f"model.path={bad}"
    result = run_cli(tmp_path, "pipeline", f"hydra.run.dir={tmp_path / 'bad'}", *args)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "is truncated" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
