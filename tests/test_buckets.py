"""Bucketing, misses and warmup."""

from __future__ import annotations

import pytest

from stages.forward.buckets import Axis, Buckets
from tests.helpers import serve


@pytest.mark.parametrize(
    ("strategy", "axis", "expected"),
    [
        ("linear", Axis(min=16, step=16, max=64), [16, 32, 48, 64]),
        ("linear", Axis(min=1, step=4, max=10), [1, 5, 9, 12]),
        ("exponential", Axis(min=1, step=4, max=20), [1, 2, 4, 8, 16, 20]),
        # steps up to the pool (87), then doubling to rows x a full row (prefix sharing)
        (
            "linear",
            Axis(min=1, step=8, max=512, dense_max=87),
            [*range(1, 88, 8), 88, 176, 352, 512],
        ),
        (
            "exponential",
            Axis(min=1, step=8, max=512, dense_max=87),
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
        ),
    ],
)
def test_prepared_sizes(strategy, axis, expected):
    assert axis.sizes(strategy) == expected


def test_lookup_takes_the_smallest_size_that_fits_and_counts_misses():
    buckets = Buckets("linear", {"decode_batch": Axis(1, 4, 8), "decode_blocks": Axis(1, 2, 5)})
    assert buckets.shape("decode", batch=3, blocks=2) == (5, 3)
    assert buckets.shape("decode", batch=9, blocks=1) == (12, 1)  # beyond max: a fallback
    assert buckets.misses == 1


def test_a_step_fits_each_dimension_as_fit_does():
    """shape (a step's fitting, inline) against fit, one dimension at a time: the same
    bucket, and a miss counted exactly where some dimension has no prepared size."""
    axes = {"prefill_batch": Axis(1, 2, 6), "prefill_seq": Axis(16, 16, 64),
            "prefill_blocks": Axis(1, 1, 4, (1, 3, 4))}  # fmt: skip
    buckets = Buckets("exponential", axes)
    misses = 0
    for batch in range(1, 9):
        for seq in range(16, 97, 16):
            for blocks in range(1, 6):
                fitted = [buckets.fit(f"prefill_{name}", n) for name, n in
                          (("batch", batch), ("seq", seq), ("blocks", blocks))]  # fmt: skip
                want = tuple(size for size, _ in fitted)
                assert buckets.shape("prefill", batch=batch, seq=seq, blocks=blocks) == want
                misses += not all(hit for _, hit in fitted)
                assert buckets.misses == misses
    assert misses > 0 and misses < 8 * 6 * 5  # both sides were taken


def test_misses_are_counted_and_outputs_unchanged(reference_run):
    ref, _ = reference_run
    steps = []
    got, engine = serve(
        ["max_tokens=64", "metadata.decode_batch.step=1", "metadata.decode_batch.max=1"],
        steps=steps,
    )
    assert engine.metadata.bucket_misses > 0
    assert all(got[rid].output_ids == ref[rid].output_ids for rid in ref)


def test_warmup_covers_the_workload(reference_run):
    ref, _ = reference_run
    from pipeline.executors import build_engine
    from tests.helpers import make_config

    engine, requests = build_engine(make_config(["max_tokens=64", "warmup=true"]))
    assert engine.warmup() > 0
    engine.run(requests)
    assert engine.metadata.bucket_misses == 0
    assert all(r.output_ids == ref[r.id].output_ids for r in requests)


def test_warmup_shapes_respect_the_budget():
    from pipeline.executors import build_engine
    from tests.helpers import make_config

    engine, _ = build_engine(make_config(["max_tokens=64"]))
    phases = engine.metadata.warmup_shapes(mixed=True)
    assert set(phases) == {"prefill", "decode", "mixed"}
    assert all(p[0] * p[1] <= 64 for p, _ in phases["prefill"])
    assert all(p[0] == 1 for p, _ in phases["mixed"])


def test_a_negative_bucket_step_is_one_line_at_start():
    from pipeline.config.checks import ConfigError
    from pipeline.executors import build_engine
    from tests.helpers import make_config

    with pytest.raises(ConfigError, match=r"^metadata.prefill_batch: need 1 <= min <= max"):
        build_engine(make_config(["metadata.prefill_batch.step=-1"]))


def reached_by_steps(sizes, block_size, budget, padded, max_rows, max_blocks):
    """Independent of the counting: every step the scheduler's rules allow (b rows, the
    widest chunk rounding to s tokens, tables of m >= s / block_size blocks), padded."""
    buckets = Buckets("linear", {n: Axis(v[0], 1, v[-1], tuple(v)) for n, v in sizes.items()})
    prefill, decode = set(), set()
    for b in range(1, max_rows + 1):
        for s in range(block_size, budget + block_size, block_size):
            tokens = b * s if padded else (s - block_size + 1) + (b - 1)
            if tokens > budget:
                continue
            for m in range(s // block_size, max_blocks + 1):
                shape, hit = buckets.pad("prefill", {"batch": b, "seq": s, "blocks": m})
                prefill |= {shape} if hit else set()
        for k in range(b, max_rows * max_blocks + 1):
            shape, hit = buckets.pad("decode", {"batch": b, "blocks": k})
            decode |= {shape} if hit else set()
    return prefill, decode


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize(
    "sizes",
    [
        {"prefill_batch": [1, 2, 3, 4, 5, 6], "prefill_seq": [16, 32, 48, 64],
         "prefill_blocks": list(range(1, 9)), "decode_batch": [1, 2, 3, 4, 5, 6],
         "decode_blocks": list(range(1, 49))},
        {"prefill_batch": [1, 2, 4, 6], "prefill_seq": [16, 32, 64], "prefill_blocks": [1, 2, 4, 8],
         "decode_batch": [1, 2, 4, 6], "decode_blocks": [1, 2, 4, 8, 16, 32, 48]},
        {"prefill_batch": [2, 6], "prefill_seq": [48, 64], "prefill_blocks": [3, 8],
         "decode_batch": [3, 6], "decode_blocks": [2, 5, 48]},
    ],
)  # fmt: skip
def test_warmup_holds_exactly_the_buckets_steps_reach(sizes, padded):
    from stages.forward.buckets import decode_shapes, prefill_shapes, warmup_counts

    prefill, decode = reached_by_steps(sizes, 16, 64, padded, max_rows=6, max_blocks=8)
    args = (sizes["prefill_batch"], sizes["prefill_seq"], sizes["prefill_blocks"], 16, 64)
    assert set(prefill_shapes(*args, padded)) == prefill
    assert set(decode_shapes(sizes["decode_batch"], sizes["decode_blocks"])) == decode
    counts = warmup_counts(sizes, 16, 64, mixed=False, padded_budget=padded)
    assert counts == {"prefill": len(prefill), "decode": len(decode)}


def test_rows_sharing_a_prefix_fit_the_derived_decode_axis_past_the_pool():
    """Rows sharing cached prefix blocks list them once each, so a decode step can list
    more blocks than the pool holds: the derived decode axis reaches what the config can
    produce, and a warmed run misses no bucket and compiles nothing while serving."""
    pool = 40
    steps: list = []
    _, engine = serve(
        ["executor=simulated", "hardware=gaudi3", "prefix_caching=true", f"num_blocks={pool}",
         "warmup=true", "workload.num_requests=16", "workload.shared_prefix_tokens=100",
         "workload.min_prompt_tokens=10", "workload.max_prompt_tokens=30",
         "workload.min_new_tokens=40", "workload.max_new_tokens=60"],
        steps=steps,
    )  # fmt: skip
    listed = max(s.needed["decode"][1] for s in steps if "decode" in s.needed)
    assert listed > pool  # the case at hand: more blocks listed than the pool has
    assert engine.metadata.bucket_misses == 0 and engine.model.recompiles == 0
    # 8 rows (max_num_seqs) of at most 16 blocks (max_model_len 256 / block_size 16)
    assert engine.metadata.buckets.sizes["decode_blocks"][-1] == 8 * 16
