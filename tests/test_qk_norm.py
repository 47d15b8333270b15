"""The per-head q/k RMSNorm of qkv_rope (Qwen3) in each backend, against numpy."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from stages.model.attention import ops_cpu, reference
from stages.model.attention.interface import Heads
from stages.model.attention.ops_intel_hpu import QK_NORM_REFUSAL, IntelHPUOps
from tests import numpy_reference

H, KV, D, HIDDEN, T, EPS = 4, 2, 16, 48, 37, 1e-6


def rand(*shape: int, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype("float32")


def rotary(interleaved: bool) -> tuple[np.ndarray, paddle.Tensor, paddle.Tensor]:
    """Angles [T, D / 2] and the model's cos, sin tables [T, D] for them."""
    inv_freq = 1.0 / 10000.0 ** (np.arange(D // 2) / (D // 2))
    angles = np.outer(np.arange(T) + 5, inv_freq)
    table = np.repeat(angles, 2, axis=1) if interleaved else np.concatenate([angles] * 2, axis=1)
    cos, sin = (paddle.to_tensor(f(table).astype("float32")) for f in (np.cos, np.sin))
    return angles, cos, sin


def expected(x, weight, q_norm, k_norm, angles, interleaved):
    """numpy: project, norm every head over its D dims, rotate; float64."""
    qkv = (x.astype(np.float64) @ weight).reshape(T, H + 2 * KV, D)
    q = numpy_reference.rms_norm(qkv[:, :H], q_norm.astype(np.float64), EPS)
    k = numpy_reference.rms_norm(qkv[:, H : H + KV], k_norm.astype(np.float64), EPS)
    rotate = numpy_reference.rotate
    return rotate(q, angles, interleaved), rotate(k, angles, interleaved), qkv[:, H + KV :]


@pytest.fixture
def inputs():
    # Norm weights far from one and uneven across dims, so a misplaced dim shows.
    return (
        rand(T, HIDDEN, seed=1),
        rand(HIDDEN, (H + 2 * KV) * D, seed=2, scale=3.0),
        1.0 + rand(D, seed=3),
        1.0 + rand(D, seed=4),
    )


@pytest.mark.parametrize("interleaved", [False, True])
def test_cpu_ops_norm_each_head_in_their_own_dim_order(inputs, interleaved):
    x, weight, q_norm, k_norm = inputs
    angles, cos, sin = rotary(interleaved)
    heads = Heads(H, KV, D, interleaved)
    packed = ops_cpu.pack_qkv(paddle.to_tensor(weight), None, heads)
    norm = ops_cpu.pack_qk_norm(paddle.to_tensor(q_norm), paddle.to_tensor(k_norm), EPS, heads)
    rope = ops_cpu.rope_table(cos, sin, heads)
    q, k, v = ops_cpu.qkv_rope(paddle.to_tensor(x), *packed, rope, heads, qk_norm=norm)
    want_q, want_k, want_v = expected(x, weight, q_norm, k_norm, angles, interleaved)
    order = ops_cpu.head_dim_order(D, interleaved)  # the backend's dims of a head
    np.testing.assert_allclose(q.numpy(), want_q[..., order], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k.numpy(), want_k[..., order], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(v.numpy(), want_v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("interleaved", [False, True])
def test_reference_norms_each_head_in_the_checkpoint_order(inputs, interleaved):
    x, weight, q_norm, k_norm = inputs
    angles, cos, sin = rotary(interleaved)
    norm = (paddle.to_tensor(q_norm), paddle.to_tensor(k_norm), EPS)
    heads = Heads(H, KV, D, interleaved)
    args = (paddle.to_tensor(x), paddle.to_tensor(weight), None, cos, sin, heads)
    q, k, v = reference.qkv_rope(*args, qk_norm=norm)
    want_q, want_k, _ = expected(x, weight, q_norm, k_norm, angles, interleaved)
    np.testing.assert_allclose(q.numpy(), want_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k.numpy(), want_k, rtol=1e-4, atol=1e-4)
    plain_q, _, _ = reference.qkv_rope(*args)
    assert np.abs(plain_q.numpy() - want_q).max() > 0.1  # the norm changed something


def test_hpu_ops_refuse_a_q_k_norm_rather_than_drop_it():
    ops = IntelHPUOps(plugin=None)
    assert not ops.supports_qk_norm and ops_cpu.supports_qk_norm
    with pytest.raises(ValueError, match="^attention.ops=intel_hpu has no fused q/k norm"):
        ops.pack_qk_norm(paddle.ones([D]), paddle.ones([D]), EPS, Heads(H, KV, D, False))
    with pytest.raises(ValueError) as err:
        ops.qkv_rope(paddle.ones([T, HIDDEN]), None, None, None, Heads(H, KV, D, False), qk_norm=())
    assert str(err.value) == QK_NORM_REFUSAL
