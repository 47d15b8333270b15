"""The Intel HPU binding against a stand-in `paddlenlp_ops` that records every call.

The stand-in computes what each op computes, from its definition in PaddleCustomDevice
`backends/intel_hpu/custom_ops`, and checks the shapes the real op would require. So each
interface function is checked twice: the recorded call (op, argument order, dtypes,
shapes, values passed through) and the result, which must equal the CPU backend's on the
same inputs.
"""

from __future__ import annotations

import sys

import numpy as np
import paddle
import pytest

from pipeline.config import checks
from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from stages.model.attention import ops_cpu, ops_intel_hpu, reference
from stages.model.attention.interface import Heads
from stages.model.attention.ops_intel_hpu import IntelHPUOps
from stages.model.attention.paged import PagedAttention, load_ops
from stages.scheduling.kv_cache import KVCacheManager
from tests.helpers import make_config

H, KV, D, BS = 4, 2, 8, 4  # query heads, key/value heads, head size, block size
NUM_BLOCKS = 6


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    if neox:  # the kernel's BLOCKWISE mode: halves
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    else:  # PAIRWISE: (2i, 2i + 1)
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        rotated = np.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    return x * cos + rotated * sin


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class RecordingOps:
    """A stand-in for `paddlenlp_ops`: records (name, args, kwargs), checks the shapes the
    real op requires, and returns what the op computes, as Paddle tensors."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def _record(self, name: str, args: tuple, kwargs: dict) -> None:
        self.calls.append((name, args, kwargs))

    def fused_qkv_rope(self, *args, **kwargs):
        self._record("fused_qkv_rope", args, kwargs)
        src, weight, bias, rotary, head_dim, num_head, total_batch = args
        neox = kwargs["use_neox_style"]
        assert kwargs["transpose"] is False and len(src.shape) == 2
        tokens = src.shape[0]
        seq = tokens // total_batch
        assert rotary.shape == [2, total_batch, seq, 1, head_dim]
        assert rotary.dtype == src.dtype
        qkv = src.numpy() @ weight.numpy() + (0 if bias is None else bias.numpy())
        kv_heads = (qkv.shape[1] - num_head * head_dim) // head_dim // 2
        qkv = qkv.reshape(total_batch, seq, num_head + 2 * kv_heads, head_dim)
        q, k, v = np.split(qkv, [num_head, num_head + kv_heads], axis=2)
        cos, sin = rotary.numpy()[0], rotary.numpy()[1]  # [B, S, 1, D]
        q, k = rotate(q, cos, sin, neox), rotate(k, cos, sin, neox)
        return paddle.to_tensor(q), paddle.to_tensor(np.stack([k, v]))

    def index_copy_(self, *args, **kwargs):
        self._record("index_copy_", args, kwargs)
        cache, index, source, dim = args
        assert dim == 0 and source.shape[1:] == cache.shape[1:]
        cache[index] = source  # in place, as the op's inplace map says

    def fused_sdpa_proj_t(self, *args, **kwargs):
        self._record("fused_sdpa_proj_t", args, kwargs)
        q, kv, mask, valid_seq_len, weight = args
        b, s, h, d = q.shape
        _, _, k_len, kv_heads, _ = kv.shape
        assert valid_seq_len is None and kv.shape[0] == 2 and kv.shape[1] == b
        keys = np.repeat(kv[0].numpy(), h // kv_heads, axis=2)  # [B, K, H, D]
        values = np.repeat(kv[1].numpy(), h // kv_heads, axis=2)
        scores = np.einsum("bshd,bkhd->bhsk", q.numpy(), keys) * kwargs["scaling_factor"]
        if kwargs["causal"]:
            assert mask is None and k_len == s
            scores = scores + np.triu(np.full((s, s), -np.inf), 1)
        else:  # grouped queries [B, KV, G, S, K] take the mask [B, 1, 1, S, K]
            assert mask.shape == [b, 1, 1, s, k_len] and mask.dtype == q.dtype
            grouped = scores.reshape(b, kv_heads, h // kv_heads, s, k_len) + mask.numpy()
            scores = grouped.reshape(b, h, s, k_len)
        out = np.einsum("bhsk,bkhd->bshd", softmax(scores), values).reshape(b * s, h * d)
        return paddle.to_tensor(out @ weight.numpy())

    def fused_flatpa_proj(self, *args, **kwargs):
        self._record("fused_flatpa_proj", args, kwargs)
        q, k_cache, v_cache, groups, blocks, mapping, bias, weight = args
        rows, one, h, d = q.shape
        kv_heads = k_cache.shape[2]
        assert one == 1 and groups.dtype == blocks.dtype == paddle.int32
        assert mapping.shape == [blocks.shape[0], rows] and bias.shape[0] == blocks.shape[0]
        q = q.numpy().reshape(rows, h, d) * kwargs["scaling_factor"]
        mapping, groups = mapping.numpy(), groups.numpy()
        block_q = np.einsum("nr,rhd->nhd", mapping, q)
        keys = np.repeat(k_cache.numpy()[blocks.numpy()], h // kv_heads, axis=2)  # [N, bs, H, D]
        values = np.repeat(v_cache.numpy()[blocks.numpy()], h // kv_heads, axis=2)
        scores = np.einsum("nhd,nshd->nhs", block_q, keys) + bias.numpy()[:, None, :]
        block_max = scores.max(axis=-1)  # [N, H]
        group_max = np.full((rows + 1, h), -np.inf)
        np.maximum.at(group_max, groups, block_max)
        adjust = np.exp(block_max - group_max[groups])
        probs = np.exp(scores - block_max[..., None])
        block_out = np.einsum("nhs,nshd->nhd", probs, values) * adjust[..., None]
        row_out = np.einsum("nr,nhd->rhd", mapping, block_out)
        row_sum = np.einsum("nr,nh->rh", mapping, probs.sum(-1) * adjust)
        out = (row_out / row_sum[..., None]).reshape(rows, 1, h * d)
        return paddle.to_tensor(out @ weight.numpy())


@pytest.fixture
def plugin() -> RecordingOps:
    return RecordingOps()


@pytest.fixture
def ops(plugin) -> IntelHPUOps:
    return IntelHPUOps(plugin)


def rand(*shape: int, seed: int = 0) -> paddle.Tensor:
    return paddle.to_tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


HIDDEN = 12
OUT = rand(H * D, HIDDEN, seed=11)  # a layer's output projection, fused into attention


def filled_caches(ops: IntelHPUOps, seed: int = 1):
    """The same keys and values in an HPU cache and a CPU cache, block by block."""
    keys, values = (
        rand(NUM_BLOCKS * BS, KV, D, seed=seed),
        rand(NUM_BLOCKS * BS, KV, D, seed=seed + 1),
    )
    blocks = paddle.arange(NUM_BLOCKS, dtype="int64")
    hpu = ops.new_caches(NUM_BLOCKS, BS, KV, D, "float32")
    cpu = ops_cpu.new_caches(NUM_BLOCKS, BS, KV, D, "float32")
    for cache, x in zip(hpu, (keys, values), strict=True):
        cache[:] = x.reshape([NUM_BLOCKS, BS, KV, D])
    ops_cpu.write_blocks(*cpu, blocks, keys, values)
    return hpu, cpu


def test_new_caches_are_the_reference_layout(ops):
    for cache in ops.new_caches(NUM_BLOCKS, BS, KV, D, "float32"):
        assert cache.shape == [NUM_BLOCKS, BS, KV, D] and cache.dtype == paddle.float32
        assert not cache.numpy().any()


@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_rope_calls_fused_qkv_rope(ops, plugin, interleaved):
    check_qkv_rope(ops, plugin, interleaved)


def check_qkv_rope(ops, plugin, interleaved):
    t, hidden = 6, 16
    x, weight, bias = (
        rand(t, hidden),
        rand(hidden, (H + 2 * KV) * D, seed=2),
        rand((H + 2 * KV) * D),
    )
    angles = np.arange(t)[:, None] * np.linspace(0.1, 1.0, D)[None, :]
    cos = paddle.to_tensor(np.cos(angles).astype("float32"))
    sin = paddle.to_tensor(np.sin(angles).astype("float32"))

    rope = ops.rope_table(cos, sin, Heads(H, KV, D, interleaved))
    q, k, v = ops.qkv_rope(x, weight, bias, rope, Heads(H, KV, D, interleaved))

    [(name, args, kwargs)] = plugin.calls
    assert name == "fused_qkv_rope"
    assert args[0] is x and args[1] is weight and args[2] is bias
    rotary = args[3].numpy()
    np.testing.assert_array_equal(rotary[0, 0, :, 0], cos.numpy())
    np.testing.assert_array_equal(rotary[1, 0, :, 0], sin.numpy())
    assert args[4:] == (D, H, 1)  # head_dim, num_head, total_batch
    assert kwargs == {"transpose": False, "use_neox_style": not interleaved}
    assert q.shape == [t, H, D] and k.shape == v.shape == [t, KV, D]
    for got, want in zip(
        (q, k, v),
        reference.qkv_rope(x, weight, bias, cos, sin, Heads(H, KV, D, interleaved)),
        strict=True,
    ):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_qkv_rope_refuses_a_weight_of_other_head_counts(ops):
    with pytest.raises(ValueError, match="num_kv_heads"):
        rope = ops.rope_table(rand(2, D), rand(2, D), Heads(H, KV, D, False))
        ops.qkv_rope(rand(2, 16), rand(16, (H + 2) * D), None, rope, Heads(H, KV, D, False))


def test_write_blocks_index_copies_on_the_block_axis(ops, plugin):
    caches = ops.new_caches(NUM_BLOCKS, BS, KV, D, "float32")
    block_indices = paddle.to_tensor([4, 1], dtype="int64")
    keys, values = rand(2 * BS, KV, D), rand(2 * BS, KV, D, seed=3)

    ops.write_blocks(*caches, block_indices, keys, values)

    assert len(plugin.calls) == 2  # one index_copy_ per cache
    for (name, args, kwargs), cache, x in zip(plugin.calls, caches, (keys, values), strict=True):
        assert name == "index_copy_" and kwargs == {}
        assert args[0] is cache and args[1] is block_indices and args[3] == 0
        assert args[2].shape == [2, BS, KV, D]
        blocks = x.numpy().reshape(2, BS, KV, D)
        np.testing.assert_array_equal(cache.numpy()[4], blocks[0])
        np.testing.assert_array_equal(cache.numpy()[1], blocks[1])
        assert not cache.numpy()[[0, 2, 3, 5]].any()


def test_write_slots_puts_each_row_at_its_block_and_offset(ops, plugin):
    caches = ops.new_caches(NUM_BLOCKS, BS, KV, D, "float32")
    keys, values = rand(3, KV, D), rand(3, KV, D, seed=3)

    slots = ops.slot_index(caches[0], paddle.to_tensor([2, 2, 5]), paddle.to_tensor([0, 3, 1]))
    ops.write_slots(*caches, slots, keys, values)

    assert plugin.calls == []  # Paddle's index_put, not a plugin op
    for cache, x in zip(caches, (keys, values), strict=True):
        written = cache.numpy()
        for row, (block, offset) in enumerate([(2, 0), (2, 3), (5, 1)]):
            np.testing.assert_array_equal(written[block, offset], x.numpy()[row])
        assert np.count_nonzero(np.abs(written).sum(axis=(2, 3))) == 3


def test_prefill_calls_causal_fused_sdpa_with_the_output_projection(ops, plugin):
    check_prefill(ops, plugin)


def check_prefill(ops, plugin):
    b, s = 2, 2 * BS
    q, k, v = rand(b, s, H, D), rand(b, s, KV, D, seed=1), rand(b, s, KV, D, seed=2)

    out = ops.prefill(q, k, v, OUT)

    [(name, args, kwargs)] = plugin.calls
    assert name == "fused_sdpa_proj_t"
    assert args[0] is q and args[2] is None and args[3] is None
    assert args[1].shape == [2, b, s, KV, D]
    np.testing.assert_array_equal(args[1].numpy()[0], k.numpy())
    np.testing.assert_array_equal(args[1].numpy()[1], v.numpy())
    assert args[4] is OUT
    assert kwargs == {"scaling_factor": D**-0.5, "causal": True, "softmax_mode": 0}
    assert out.shape == [b * s, HIDDEN]
    want = ops_cpu.prefill(q, k, v, OUT).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_prefill_with_context_forwards_the_gathered_blocks_and_the_mask(ops, plugin):
    (k_cache, v_cache), (k_cpu, v_cpu) = filled_caches(ops)
    b, s, m = 2, BS, 3
    block_list = paddle.to_tensor([[3, 0, 5], [1, 4, 2]], dtype="int64")
    ctx = np.array([2 * BS, BS])  # row 1 has one block fewer of context
    visible = np.arange(m * BS)[None, None, :] <= ctx[:, None, None] + np.arange(s)[None, :, None]
    mask = paddle.to_tensor(np.where(visible, 0.0, -1e30).astype("float32")[:, None])
    q = rand(b, s, H, D, seed=5)

    out = ops.prefill_with_context(q, k_cache, v_cache, block_list, mask, OUT)

    [(name, args, kwargs)] = plugin.calls
    assert name == "fused_sdpa_proj_t" and args[0] is q and args[3] is None
    kv = args[1].numpy()
    assert kv.shape == (2, b, m * BS, KV, D)
    np.testing.assert_array_equal(kv[0, 1, :BS], k_cache.numpy()[1])  # row 1's first block
    np.testing.assert_array_equal(kv[1, 0, 2 * BS :], v_cache.numpy()[5])  # row 0's last block
    np.testing.assert_array_equal(args[2].numpy()[:, 0], mask.numpy())
    assert args[4] is OUT
    assert kwargs == {"scaling_factor": D**-0.5, "causal": False, "softmax_mode": 0}
    want = ops_cpu.prefill_with_context(q, k_cpu, v_cpu, block_list, mask, OUT)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_decode_calls_fused_flatpa_proj_with_groups_before_the_block_list(ops, plugin):
    check_decode(ops, plugin)


def check_decode(ops, plugin):
    (k_cache, v_cache), (k_cpu, v_cpu) = filled_caches(ops, seed=7)
    rows = 3
    # Row 0 owns blocks 2 and 4 (5 tokens), row 1 block 0 (3 tokens), row 2 block 5 (1
    # token); the last entry is padding: scratch-like block 1, owned by the last row.
    block_list = paddle.to_tensor([2, 4, 0, 5, 1], dtype="int64")
    block_groups = paddle.to_tensor([0, 0, 1, 2, 2], dtype="int64")
    mapping = np.zeros((5, rows), dtype="float32")
    mapping[[0, 1, 2, 3], [0, 0, 1, 2]] = 1.0
    filled = np.array([BS, 1, 3, 1, 0])
    bias = np.where(np.arange(BS)[None, :] < filled[:, None], 0.0, -1e30).astype("float32")
    block_mapping, block_bias = paddle.to_tensor(mapping), paddle.to_tensor(bias)
    # Rows side by side, two blocks each: row 0's at 0 and 1, row 1's at 2, row 2's at 4;
    # the padding at 6, the spare row.
    row_slots = paddle.to_tensor([0, 1, 2, 4, 6], dtype="int64")
    q = rand(rows, H, D, seed=9)
    flat = (block_list, block_groups, block_mapping)

    out = ops.decode(
        q, k_cache, v_cache, *flat, ops.decode_layout(block_bias, row_slots, 2, rows, H), OUT
    )

    [(name, args, kwargs)] = plugin.calls
    assert name == "fused_flatpa_proj"
    assert args[0].shape == [rows, 1, H, D]
    np.testing.assert_array_equal(args[0].numpy()[:, 0], q.numpy())
    assert args[1] is k_cache and args[2] is v_cache
    np.testing.assert_array_equal(args[3].numpy(), block_groups.numpy())
    np.testing.assert_array_equal(args[4].numpy(), block_list.numpy())
    assert args[3].dtype == args[4].dtype == paddle.int32
    np.testing.assert_array_equal(args[5].numpy(), mapping)
    np.testing.assert_array_equal(args[6].numpy(), bias)
    assert args[7] is OUT
    assert kwargs == {"scaling_factor": D**-0.5}
    assert out.shape == [rows, HIDDEN]
    layout = ops_cpu.decode_layout(block_bias, row_slots, 2, rows, H)
    want = ops_cpu.decode(q, k_cpu, v_cpu, *flat, layout, OUT)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_decode_span_reaches_the_fused_op_row_by_row(ops, plugin):
    """The same rows as check_decode, their blocks at their places in the span of blocks
    0..5 (blocks 1 and 3 are another request's): the op gets them sorted by row, and the
    output is the row-by-row one."""
    (k_cache, v_cache), (k_cpu, v_cpu) = filled_caches(ops, seed=7)
    rows = 3
    block_groups = paddle.to_tensor([1, 2, 0, 2, 0, 2], dtype="int64")
    mapping = np.zeros((6, rows), dtype="float32")
    mapping[[0, 2, 4, 5], [1, 0, 0, 2]] = 1.0
    filled = np.array([3, 0, BS, 0, 1, 1])
    bias = np.where(np.arange(BS)[None, :] < filled[:, None], 0.0, -1e30).astype("float32")
    q = rand(rows, H, D, seed=9)
    row_slots = paddle.to_tensor([2, 6, 0, 6, 1, 4], dtype="int64")
    layout = ops.decode_layout(paddle.to_tensor(bias), row_slots, 2, rows, H)
    span = (paddle.arange(6), block_groups, paddle.to_tensor(mapping), layout)

    out = ops.decode(q, k_cache, v_cache, *span, OUT, (0, 6))

    [(_, args, _)] = plugin.calls
    groups = args[3].numpy()
    assert (np.diff(groups) >= 0).all()
    for block, row in zip(args[4].numpy(), groups, strict=True):
        assert row == {0: 1, 2: 0, 4: 0, 5: 2}.get(int(block), 2)
    listed = (
        paddle.to_tensor([2, 4, 0, 5, 1], dtype="int64"),
        paddle.to_tensor([0, 0, 1, 2, 2], dtype="int64"),
        paddle.to_tensor(
            (np.eye(rows)[[0, 0, 1, 2, 2]] * [[1], [1], [1], [1], [0]]).astype("float32")
        ),
        ops_cpu.decode_layout(
            paddle.to_tensor(
                np.where(
                    np.arange(BS)[None, :] < np.array([BS, 1, 3, 1, 0])[:, None], 0.0, -1e30
                ).astype("float32")
            ),
            paddle.to_tensor([0, 1, 2, 4, 6], dtype="int64"),
            2,
            rows,
            H,
        ),
    )
    want = ops_cpu.decode(q, k_cpu, v_cpu, *listed, OUT)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


class SwappedGroupsAndList(RecordingOps):
    """As if the binding passed block_list where the op takes block_groups."""

    def fused_flatpa_proj(self, *args, **kwargs):
        args = list(args)
        args[3], args[4] = args[4], args[3]
        return super().fused_flatpa_proj(*args, **kwargs)


class SwappedKeysAndValues(RecordingOps):
    """As if the binding read the op's key_value_states the wrong way round."""

    def fused_qkv_rope(self, *args, **kwargs):
        q, kv = super().fused_qkv_rope(*args, **kwargs)
        return q, paddle.flip(kv, axis=[0])


class WrongScale(RecordingOps):
    """As if the binding passed 1 / D rather than 1 / sqrt(D)."""

    def fused_sdpa_proj_t(self, *args, **kwargs):
        q = args[0]
        return super().fused_sdpa_proj_t(*args, **{**kwargs, "scaling_factor": 1 / q.shape[-1]})


@pytest.mark.parametrize(
    ("mutant", "check"),
    [
        (SwappedGroupsAndList, check_decode),
        (SwappedKeysAndValues, lambda ops, plugin: check_qkv_rope(ops, plugin, False)),
        (WrongScale, check_prefill),
    ],
    ids=["decode groups/list", "qkv_rope k/v", "prefill scale"],
)
def test_the_checks_catch_a_wrong_binding(mutant, check):
    plugin = mutant()
    with pytest.raises((AssertionError, IndexError)):
        check(IntelHPUOps(plugin), plugin)


def test_load_ops_builds_the_backend_from_the_installed_plugin(monkeypatch, plugin):
    monkeypatch.setitem(sys.modules, "paddlenlp_ops", plugin)
    backend = load_ops("intel_hpu")
    assert isinstance(backend, IntelHPUOps) and backend.plugin is plugin
    attention = PagedAttention(
        KVCacheManager(NUM_BLOCKS, BS), 2, KV, D, ops="intel_hpu", dtype="float32"
    )
    assert [c.shape for c in attention.k_cache] == [[NUM_BLOCKS + 1, BS, KV, D]] * 2


def test_load_ops_without_the_plugin_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "paddlenlp_ops", None)  # import fails
    with pytest.raises(ValueError) as err:
        load_ops("intel_hpu")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(ops_intel_hpu.INSTALL_HINT)
    assert "paddle-custom-device" in message and "backends/intel_hpu/custom_ops" in message


def test_the_pipeline_without_the_plugin_fails_at_start_naming_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "paddlenlp_ops", None)
    cfg = make_config(["attention.ops=intel_hpu", "device=intel_hpu"])
    with pytest.raises(ConfigError) as no_device:
        build_engine(cfg)
    # A visible device without the custom ops is refused too, before any stage is built.
    monkeypatch.setattr(checks, "_hpu_plugin_present", lambda: True)
    monkeypatch.setattr(checks, "_hpu_ops_present", lambda: False)
    with pytest.raises(ConfigError) as no_ops:
        build_engine(cfg)
    for err in (no_device, no_ops):
        message = str(err.value)  # the command line prints it as one line, exit code 2
        assert "\n" not in message
        assert "paddle-custom-device for intel_hpu" in message
        assert "paddlenlp_ops" in message and "backends/intel_hpu/custom_ops" in message
    assert "no Intel HPU is visible" in str(no_device.value)
    assert "paddlenlp_ops is missing" in str(no_ops.value)
