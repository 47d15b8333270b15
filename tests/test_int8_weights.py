"""model.weights=int8: the MLPs and lm head as int8 rows with a scale per output, against
numpy computing with the same rounded weights, and against float32."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from stages.model.int8_weight import MAX_KERNEL_ROWS, Int8Weight, KernelBuildError, kernel
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


@pytest.mark.parametrize("rows", [1, 3, MAX_KERNEL_ROWS, MAX_KERNEL_ROWS + 5])
def test_matmul_is_x_times_the_widened_weights(built, rows):
    """The operator (up to MAX_KERNEL_ROWS rows) and the widened path beyond it."""
    rng = np.random.default_rng(rows)
    w = rng.normal(0, 0.1, (96, 200)).astype(np.float32)
    x = rng.normal(0, 1, (rows, 96)).astype(np.float32)
    got = Int8Weight.of_matrix(paddle.to_tensor(w)).matmul(paddle.to_tensor(x)).numpy()
    expected = x.astype(np.float64) @ rounded_rows(w.T).T.astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gguf_model_with_int8_weights_matches_numpy_on_the_rounded_weights(built, tmp_path):
    """Every MLP and the (tied) lm head rounded as int8, the rest exact: the served logits
    are numpy's forward on weights rounded alike."""
    vocab = train_vocab()
    config = model_config("Qwen2ForCausalLM", vocab.get_vocab_size(), True)
    rng = np.random.default_rng(0)
    path = tmp_path / "tied.gguf"
    types = {"ffn_down.weight": GgufType.Q8_0}
    held = write_model(path, config, hf_weights(config, rng), types, vocab, rng)
    rounded = dict(held)
    for name, w in held.items():
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")):
            rounded[name] = rounded_rows(w.astype(np.float32))
    rounded["model.embed_tokens.weight"] = rounded_rows(
        held["model.embed_tokens.weight"].astype(np.float32)
    )
    overrides = ["model=gguf", f"model.path={path}", "model.weights=int8", "max_tokens=16"]
    overrides += ["workload.num_requests=2", "workload.max_prompt_tokens=30"]
    got, engine = serve([*overrides, "workload.max_new_tokens=3"], record_logits=True)
    worst = 0.0
    for rid, request in got.items():
        assert request.finish_reason == "length", request.error
        expected = numpy_reference.forward(
            config, rounded, request.prompt_ids + request.output_ids[:-1]
        )
        for j in range(len(request.output_ids)):
            row = engine.sampler.logits[(rid, j)]
            worst = max(worst, np.abs(row - expected[len(request.prompt_ids) - 1 + j]).max())
    assert worst < 1e-4
