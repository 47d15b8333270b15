"""The CPU ops at serving sizes against a loop-per-row numpy oracle.

The end-to-end oracle tests run small blocks and short contexts; these run one op at the
shapes of a real decode or chunk (block size 128, a hundred blocks, scattered block
lists), where layout and stride mistakes show up.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from stages.model.attention import ops_cpu
from stages.model.attention.interface import Heads
from tests import numpy_reference

H, KV, D, BS, HIDDEN = 8, 4, 64, 128, 96
POOL = 161  # blocks, the last one scratch


def rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def filled_caches(keys: np.ndarray, values: np.ndarray) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Caches whose block b holds keys / values[b * BS : (b + 1) * BS], a few blocks a write."""
    k_cache, v_cache = ops_cpu.new_caches(POOL, BS, KV, D, "float32")
    for first in range(0, POOL - 1, 8):
        blocks = paddle.arange(first, min(first + 8, POOL - 1))
        rows = slice(first * BS, (first + blocks.shape[0]) * BS)
        ops_cpu.write_blocks(
            k_cache, v_cache, blocks, paddle.to_tensor(keys[rows]), paddle.to_tensor(values[rows])
        )
    return k_cache, v_cache


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One query [H, D] over keys, values [L, KV, D]: plain softmax attention."""
    out = np.zeros((H, D), dtype=np.float64)
    for h in range(H):
        kv = h // (H // KV)
        scores = keys[:, kv] @ q[h] / np.sqrt(D)
        p = np.exp(scores - scores.max())
        out[h] = (p / p.sum()) @ values[:, kv]
    return out.reshape(-1)


@pytest.fixture(scope="module")
def cached():
    keys, values = rand((POOL - 1) * BS, KV, D, seed=1), rand((POOL - 1) * BS, KV, D, seed=2)
    return keys, values, *filled_caches(keys, values)


@pytest.mark.parametrize("layout", ["rows", "span"])
def test_decode_matches_per_row_attention(cached, layout):
    """Blocks listed row by row (padding at the end), or the whole pool read as a span in
    which the rows' blocks interleave and every other block is masked padding."""
    keys, values, k_cache, v_cache = cached
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 5 * BS, 24)  # tokens per row, its last block partly filled
    counts = -(-lengths // BS)
    block_list = rng.permutation(POOL - 1)[: counts.sum()]
    owner = np.repeat(np.arange(24), counts)
    index_in_row = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    if layout == "rows":
        blocks = np.concatenate([block_list, np.full(5, POOL - 1)])
        slots, block_range = np.arange(counts.sum()), None
    else:
        blocks, slots, block_range = np.arange(POOL), block_list, (0, POOL)
    groups = np.full(len(blocks), 23)
    groups[slots] = owner
    mapping = np.zeros((len(blocks), 24), dtype="float32")
    mapping[slots, owner] = 1.0
    filled = np.zeros(len(blocks), dtype=np.int64)
    filled[slots] = lengths[owner] - index_in_row * BS
    bias = np.where(np.arange(BS)[None, :] < filled[:, None], 0.0, -1e30).astype("float32")
    width = int(counts.max())  # rows side by side: row r's k-th block at r * width + k
    row_slots = np.full(len(blocks), 24 * width)
    row_slots[slots] = owner * width + index_in_row
    q, out_weight = rand(24, H, D, seed=4), rand(H * D, HIDDEN, seed=5)

    got = ops_cpu.decode(
        paddle.to_tensor(q),
        k_cache,
        v_cache,
        paddle.to_tensor(blocks),
        paddle.to_tensor(groups),
        paddle.to_tensor(mapping),
        ops_cpu.decode_layout(paddle.to_tensor(bias), paddle.to_tensor(row_slots), width, 24, H),
        paddle.to_tensor(out_weight),
        block_range,
    ).numpy()

    rows = []
    for r in range(24):
        own = block_list[(np.cumsum(counts) - counts)[r] :][: counts[r]]
        slots = (own[:, None] * BS + np.arange(BS)).reshape(-1)[: lengths[r]]
        rows.append(attend(q[r], keys[slots], values[slots]))
    np.testing.assert_allclose(got, np.stack(rows) @ out_weight, rtol=1e-4, atol=1e-4)


def test_prefill_with_context_matches_per_row_attention(cached):
    keys, values, k_cache, v_cache = cached
    rng = np.random.default_rng(6)
    contexts, seq, width = np.array([3 * BS, BS, 0 + 2 * BS]), 2 * BS, 6
    tables = [rng.permutation(POOL - 1)[:width] for _ in contexts]
    visible = np.arange(width * BS)[None, None, :] <= (
        contexts[:, None, None] + np.arange(seq)[None, :, None]
    )
    mask = np.where(visible, 0.0, -1e30).astype("float32")[:, None]
    q, out_weight = rand(len(contexts), seq, H, D, seed=7), rand(H * D, HIDDEN, seed=8)

    got = ops_cpu.prefill_with_context(
        paddle.to_tensor(q),
        k_cache,
        v_cache,
        paddle.to_tensor(np.stack(tables)),
        paddle.to_tensor(mask),
        paddle.to_tensor(out_weight),
    ).numpy()

    want = []
    for row, (ctx, table) in enumerate(zip(contexts, tables, strict=True)):
        slots = (table[:, None] * BS + np.arange(BS)).reshape(-1)
        for i in range(seq):
            seen = slots[: ctx + i + 1]
            want.append(attend(q[row, i], keys[seen], values[seen]))
    np.testing.assert_allclose(got, np.stack(want) @ out_weight, rtol=1e-4, atol=1e-4)


def test_prefill_with_context_attends_only_each_rows_real_queries(cached):
    """Rows of other lengths than the padded chunk, contexts off block boundaries, a row
    without context and a padding row: each real query sees its context and its chunk up
    to itself; padding queries come back finite (their outputs are never read)."""
    keys, values, k_cache, v_cache = cached
    rng = np.random.default_rng(16)
    contexts = np.array([2 * BS + 37, 0, 5, 0])
    lengths = np.array([3 * BS - 9, 2 * BS + 1, 40, 0])  # the last row is padding
    seq, width = 3 * BS, 6
    tables = np.stack([rng.permutation(POOL - 1)[:width] for _ in contexts])
    visible = np.arange(width * BS)[None, None, :] <= (
        contexts[:, None, None] + np.arange(seq)[None, :, None]
    )
    mask = np.where(visible, 0.0, -1e30).astype("float32")[:, None]
    q, out_weight = rand(len(contexts), seq, H, D, seed=17), rand(H * D, HIDDEN, seed=18)
    layout = ops_cpu.prefill_layout(contexts, lengths, "float32")
    assert [len(row) for row in layout.rows] == [3, 3, 1, 0]

    got = ops_cpu.prefill_with_context(
        paddle.to_tensor(q),
        k_cache,
        v_cache,
        paddle.to_tensor(tables),
        paddle.to_tensor(mask),
        paddle.to_tensor(out_weight),
        layout,
    ).numpy()

    assert got.shape == (len(contexts) * seq, HIDDEN) and np.isfinite(got).all()
    for row, (ctx, length, table) in enumerate(zip(contexts, lengths, tables, strict=True)):
        slots = (table[:, None] * BS + np.arange(BS)).reshape(-1)
        want = [attend(q[row, i], keys[slots[: ctx + i + 1]], values[slots[: ctx + i + 1]])
                for i in range(length)]  # fmt: skip
        if length:
            rows = got[row * seq : row * seq + length]
            np.testing.assert_allclose(rows, np.stack(want) @ out_weight, rtol=1e-4, atol=1e-4)


def test_slot_writes_land_where_block_writes_put_the_same_tokens():
    keys, values = rand(3 * BS, KV, D, seed=9), rand(3 * BS, KV, D, seed=15)
    by_block = ops_cpu.new_caches(8, BS, KV, D, "float32")
    ops_cpu.write_blocks(
        *by_block, paddle.to_tensor([5, 0, 2]), paddle.to_tensor(keys), paddle.to_tensor(values)
    )
    by_slot = ops_cpu.new_caches(8, BS, KV, D, "float32")
    blocks = np.repeat([5, 0, 2], BS)
    offsets = np.tile(np.arange(BS), 3)
    order = np.random.default_rng(10).permutation(3 * BS)
    slots = ops_cpu.slot_index(
        by_slot[0], paddle.to_tensor(blocks[order]), paddle.to_tensor(offsets[order])
    )
    ops_cpu.write_slots(
        *by_slot,
        slots,
        paddle.to_tensor(keys[order]),
        paddle.to_tensor(values[order]),
    )
    for block_cache, slot_cache in zip(by_block, by_slot, strict=True):
        np.testing.assert_array_equal(block_cache.numpy(), slot_cache.numpy())
        assert not block_cache.numpy()[[1, 3, 4, 6, 7]].any()
    # Keys and values went to their own caches: block 5 holds token 0 of each, the keys'
    # blocks transposed.
    np.testing.assert_array_equal(by_block[0].numpy()[5, :, :, 0], keys[0])
    np.testing.assert_array_equal(by_block[1].numpy()[5, :, 0], values[0])


def test_causal_prefill_matches_per_row_attention():
    b, s = 2, 5 * BS
    q, k, v = rand(b, s, H, D, seed=11), rand(b, s, KV, D, seed=12), rand(b, s, KV, D, seed=13)
    out_weight = rand(H * D, HIDDEN, seed=14)
    got = ops_cpu.prefill(*map(paddle.to_tensor, (q, k, v, out_weight))).numpy()
    want = [attend(q[r, i], k[r, : i + 1], v[r, : i + 1]) for r in range(b) for i in range(s)]
    np.testing.assert_allclose(got, np.stack(want) @ out_weight, rtol=1e-4, atol=1e-4)


def test_causal_prefill_skips_padding_and_tiles_long_rows():
    """Rows shorter than the padded chunk, one a tile and a bit, one under a tile, one
    padding only: the real queries match per-row attention."""
    lengths = np.array([3 * ops_cpu.QUERY_TILE + 1, ops_cpu.QUERY_TILE - 3, 0])
    b, s = len(lengths), 4 * ops_cpu.QUERY_TILE
    q, k, v = rand(b, s, H, D, seed=19), rand(b, s, KV, D, seed=20), rand(b, s, KV, D, seed=21)
    out_weight = rand(H * D, HIDDEN, seed=22)
    layout = ops_cpu.prefill_layout(np.zeros(b, np.int64), lengths, "float32")
    got = ops_cpu.prefill(*map(paddle.to_tensor, (q, k, v, out_weight)), layout).numpy()
    assert got.shape == (b * s, HIDDEN) and np.isfinite(got).all()
    for r, length in enumerate(lengths[:2]):
        want = [attend(q[r, i], k[r, : i + 1], v[r, : i + 1]) for i in range(length)]
        rows = got[r * s : r * s + length]
        np.testing.assert_allclose(rows, np.stack(want) @ out_weight, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_rope_on_packed_weights_matches_numpy_rotary(interleaved):
    """q and k come back in the backend's dim order; put back, they are the rotary positions
    of numpy_reference, and the values are untouched."""
    t, width = 300, (H + 2 * KV) * D
    x, weight, bias = rand(t, HIDDEN, seed=5), rand(HIDDEN, width, seed=6), rand(width, seed=7)
    positions = np.arange(t) + 40
    inv_freq = 1.0 / 10000.0 ** (np.arange(D // 2) / (D // 2))
    angles = np.outer(positions, inv_freq)
    table = np.repeat(angles, 2, axis=1) if interleaved else np.concatenate([angles] * 2, axis=1)
    heads = Heads(H, KV, D, interleaved)
    packed = ops_cpu.pack_qkv(paddle.to_tensor(weight), paddle.to_tensor(bias), heads)
    rope = ops_cpu.rope_table(
        paddle.to_tensor(np.cos(table).astype("float32")),
        paddle.to_tensor(np.sin(table).astype("float32")),
        heads,
    )
    q, k, v = ops_cpu.qkv_rope(paddle.to_tensor(x), *packed, rope, heads)
    qkv = (x.astype(np.float64) @ weight + bias).reshape(t, H + 2 * KV, D)
    order = ops_cpu.head_dim_order(D, interleaved)
    want_q = numpy_reference.rotate(qkv[:, :H], angles, interleaved)
    want_k = numpy_reference.rotate(qkv[:, H : H + KV], angles, interleaved)
    np.testing.assert_allclose(q.numpy(), want_q[..., order], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k.numpy(), want_k[..., order], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(v.numpy(), qkv[:, H + KV :], rtol=1e-4, atol=1e-4)
    assert sorted(order) == list(range(D))


def _packed(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each row's first lengths[row] tokens, one row after another."""
    return np.concatenate([x[row, :n] for row, n in enumerate(lengths)])


def test_packed_causal_prefill_matches_per_row_attention():
    """q, k, v of the rows' real tokens only (layout.starts): one output row per real token,
    each per-row attention over its own row's keys."""
    lengths = np.array([2 * ops_cpu.QUERY_TILE + 5, 0, ops_cpu.QUERY_TILE - 7, 1])
    b, s = len(lengths), 3 * ops_cpu.QUERY_TILE
    q, k, v = rand(b, s, H, D, seed=23), rand(b, s, KV, D, seed=24), rand(b, s, KV, D, seed=25)
    out_weight = rand(H * D, HIDDEN, seed=26)
    layout = ops_cpu.prefill_layout(np.zeros(b, np.int64), lengths, "float32", packed=True)
    assert layout.starts == (0, 261, 261, 382)
    packed = [paddle.to_tensor(_packed(x, lengths)) for x in (q, k, v)]
    got = ops_cpu.prefill(*packed, paddle.to_tensor(out_weight), layout).numpy()
    want = [
        attend(q[r, i], k[r, : i + 1], v[r, : i + 1]) for r in range(b) for i in range(lengths[r])
    ]
    assert got.shape == (lengths.sum(), HIDDEN)
    np.testing.assert_allclose(got, np.stack(want) @ out_weight, rtol=1e-4, atol=1e-4)


def test_packed_prefill_with_context_matches_per_row_attention(cached):
    keys, values, k_cache, v_cache = cached
    rng = np.random.default_rng(27)
    contexts, lengths = np.array([BS + 3, 0, 2 * BS]), np.array([BS + 20, 30, 0])
    seq, width = 2 * BS, 5
    tables = np.stack([rng.permutation(POOL - 1)[:width] for _ in contexts])
    q, out_weight = rand(len(contexts), seq, H, D, seed=28), rand(H * D, HIDDEN, seed=29)
    layout = ops_cpu.prefill_layout(contexts, lengths, "float32", packed=True)
    got = ops_cpu.prefill_with_context(
        paddle.to_tensor(_packed(q, lengths)),
        k_cache,
        v_cache,
        paddle.to_tensor(tables),
        paddle.to_tensor(np.zeros((len(contexts), 1, seq, width * BS), np.float32)),
        paddle.to_tensor(out_weight),
        layout,
    ).numpy()
    want = []
    for row, (ctx, length, table) in enumerate(zip(contexts, lengths, tables, strict=True)):
        slots = (table[:, None] * BS + np.arange(BS)).reshape(-1)
        want += [attend(q[row, i], keys[slots[: ctx + i + 1]], values[slots[: ctx + i + 1]])
                 for i in range(length)]  # fmt: skip
    assert got.shape == (lengths.sum(), HIDDEN)
    np.testing.assert_allclose(got, np.stack(want) @ out_weight, rtol=1e-4, atol=1e-4)
