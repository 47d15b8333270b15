"""The decode-step benchmark's roofline, against hand-computed floors (no model is served)."""

from __future__ import annotations

import pytest

from benchmarks.decode_step import decode_roofline
from stages.model.spec import ModelSpec

# hidden 4, 1 layer, 2 heads, 1 KV head, head_dim 2, intermediate 8, vocab 10
DIMS = ModelSpec(10, 4, 1, 2, 1, 2, 8)


def test_decode_roofline_by_hand() -> None:
    # Per token: QKV 4*(2+2)*2 = 32, output 2*2*4 = 16, MLP 3*4*8 = 96 multiply-adds,
    # so 2 * 144 = 288 FLOPs, and the head 2*4*10 = 80: 2 rows give 736 dense FLOPs.
    # Attention: 2 rows of 3 keys, QK and PV over 2 heads of 2 dims: 4*2*2*6 = 96 FLOPs.
    # Cached keys and values: 2 (K, V) * 2 rows * 3 tokens * 1 head * 2 dims * 4 bytes = 96.
    roofline = decode_roofline(DIMS, 40, batch=2, context=3, rate=100.0, bandwidth=50.0)
    assert roofline.flop_ms == pytest.approx((736 + 96) / 100 * 1e3)
    assert roofline.memory_ms == pytest.approx((40 + 96) / 50 * 1e3)
    assert roofline.dense_ms == pytest.approx(736 / 100 * 1e3)  # compute-bound
    assert roofline.attention_ms == pytest.approx(96 / 50 * 1e3)  # memory-bound
    assert roofline.whole_ms == pytest.approx(8320.0)
    assert roofline.by_part_ms == pytest.approx(7360.0 + 1920.0)


@pytest.mark.parametrize("rate, bandwidth", [(1e3, 1e1), (1e1, 1e3), (300.0, 70.0)])
@pytest.mark.parametrize("batch, context", [(1, 1), (4, 100), (64, 640)])
def test_decode_roofline_by_part_is_never_below_the_whole(rate, bandwidth, batch, context):
    roofline = decode_roofline(DIMS, 1000, batch, context, rate, bandwidth)
    assert roofline.by_part_ms >= roofline.whole_ms * (1 - 1e-12)
    assert roofline.by_part_ms <= roofline.flop_ms + roofline.memory_ms * (1 + 1e-12)
