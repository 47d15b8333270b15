"""model.weights=int8: every projection and the lm head as int8 rows with a scale per output,
against numpy computing with the same rounded weights (and inputs rounded as the operator
rounds them), and against float32."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from stages.model import compiled_layers
from stages.model.int8_weight import Int8Weight, KernelBuildError, kernel
from tests import numpy_reference
from tests.gguf_files import T as GgufType
from tests.gguf_files import hf_weights, model_config, train_vocab, write_model
from tests.helpers import serve


@pytest.fixture(scope="module")
def built():
    try:
        return kernel()
    except KernelBuildError as err:
        pytest.skip(str(err))


def rounded_rows(w: np.ndarray) -> np.ndarray:
    """Each row [out, in] at the nearest of 255 levels spanning its largest magnitude."""
    scale = (np.abs(w).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    return (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)


def test_rows_round_to_within_half_a_level():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (64, 40)).astype(np.float32)
    stored = Int8Weight.of_matrix(paddle.to_tensor(w))
    widened = stored.widened().numpy().T
    level = np.abs(w).max(axis=0) / 127
    assert np.all(np.abs(widened - w) <= level / 2 + 1e-7)
    np.testing.assert_allclose(widened, rounded_rows(w.T).T, rtol=0, atol=1e-6)


def input_levels(k: int) -> int:
    """int8_matmul.cc's largest input level: k / 16 products of an int8 weight and a level
    fit an int32 lane."""
    return min(32767, (2**31 - 1) * 16 // (127 * max(k, 16)))


def kernel_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [n, in] @ w [in, out] as the operator computes it, by hand: w's columns rounded to
    int8 levels, x's rows to 16-bit ones, their products summed exactly in integers."""
    q = w.T / (np.abs(w.T).max(axis=1, keepdims=True) / np.float32(127))
    q = np.clip(np.rint(q), -127, 127).astype(np.int64)
    w_step = (np.abs(w.T).max(axis=1) / np.float32(127)).astype(np.float32)
    x_step = (np.abs(x).max(axis=1) / np.float32(input_levels(x.shape[1]))).astype(np.float32)
    levels = np.rint(x * (np.float32(1) / x_step[:, None])).astype(np.int64)
    return (levels @ q.T) * x_step[:, None].astype(np.float64) * w_step.astype(np.float64)


# 96 inputs: the vector path (a multiple of 32); 40: the scalar one. 11 outputs: a partial
# tile of four.
@pytest.mark.parametrize("inputs", [96, 40])
# 70 rows: more than one block of 64 inputs.
@pytest.mark.parametrize("rows", [1, 3, 8, 70])
def test_operator_is_the_integer_product_of_the_rounded_operands(built, rows, inputs):
    rng = np.random.default_rng(rows)
    w = rng.normal(0, 0.1, (inputs, 203)).astype(np.float32)
    x = rng.normal(0, 1, (rows, inputs)).astype(np.float32)
    weight = Int8Weight.of_matrix(paddle.to_tensor(w))
    expected = kernel_reference(x, w)
    for threads in (1, 2, 3):
        weight.threads = threads
        got = weight.matmul(paddle.to_tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows", [1, 8])
def test_operator_error_is_within_its_roundings(built, rows):
    """Against float32 on the rounded weights, each output is off by at most what rounding
    the inputs allows: half an input level times the sum of the weights' magnitudes."""
    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.1, (576, 64)).astype(np.float32)
    x = rng.standard_t(3, (rows, 576)).astype(np.float32)  # heavy tails: outliers in a row
    weight = Int8Weight.of_matrix(paddle.to_tensor(w))
    widened = weight.widened().numpy().astype(np.float64)  # [out, in]
    got = weight.matmul(paddle.to_tensor(x)).numpy()
    exact = x.astype(np.float64) @ widened.T
    half_level = np.abs(x).max(axis=1, keepdims=True) / input_levels(576) / 2
    bound = half_level * np.abs(widened).sum(axis=1)[None, :] + 1e-5
    assert np.all(np.abs(got - exact) <= bound)
    assert np.abs(got - exact).max() > 0  # the inputs were rounded, not multiplied exactly


PROJECTIONS = tuple(
    f"{part}_proj.weight" for part in ("q", "k", "v", "o", "mlp.gate", "mlp.up", "mlp.down")
)


# Qwen2: q/k/v biases, a tied lm head; Llama: none, its own lm head, q/k rows permuted in
# the file.
@pytest.mark.parametrize("arch, tied", [("Qwen2ForCausalLM", True), ("LlamaForCausalLM", False)])
def test_gguf_model_with_int8_weights_matches_numpy_on_the_rounded_weights(
    built, tmp_path, monkeypatch, arch, tied
):
    """Every projection and the lm head rounded as int8, the rest exact: the served logits
    are numpy's forward on weights rounded alike, within what the operator's rounding of
    its inputs to 16-bit levels adds: a level is 1 / 65534 of a row's peak, and the logits
    move by ~1e-5 of their largest (float32 alone: 1e-7); leaving the attention's
    projections exact in numpy moves them by ~2e-3 of it. Decode steps of three rows at
    once run each layer whole (decode_layer.cc), prefills the operators one by one."""
    whole_layers = []
    decode_layer = compiled_layers.decode_layer
    monkeypatch.setattr(
        compiled_layers,
        "decode_layer",
        lambda *args: whole_layers.append(1) or decode_layer(*args),
    )
    vocab = train_vocab()
    config = model_config(arch, vocab.get_vocab_size(), tied)
    rng = np.random.default_rng(0)
    path = tmp_path / "model.gguf"
    types = {"ffn_down.weight": GgufType.Q8_0}
    held = write_model(path, config, hf_weights(config, rng), types, vocab, rng)
    rounded = dict(held)
    for name, w in held.items():
        if name.endswith(PROJECTIONS) or name in ("lm_head.weight", "model.embed_tokens.weight"):
            rounded[name] = rounded_rows(w.astype(np.float32))
    if not tied:  # the embedding itself stays float32
        rounded["model.embed_tokens.weight"] = held["model.embed_tokens.weight"]
    overrides = ["model=gguf", f"model.path={path}", "model.weights=int8", "max_tokens=64"]
    overrides += ["workload.num_requests=3", "workload.max_prompt_tokens=30", "block_size=8"]
    got, engine = serve([*overrides, "workload.max_new_tokens=12"], record_logits=True)
    worst = largest = 0.0
    for rid, request in got.items():
        assert request.finish_reason == "length", request.error
        expected = numpy_reference.forward(
            config, rounded, request.prompt_ids + request.output_ids[:-1]
        )
        for j in range(len(request.output_ids)):
            row = engine.sampler.logits[(rid, j)]
            worst = max(worst, np.abs(row - expected[len(request.prompt_ids) - 1 + j]).max())
            largest = max(largest, np.abs(row).max())
    assert worst < 1e-4 * largest
    assert whole_layers  # the decode steps ran decode_layer.cc
