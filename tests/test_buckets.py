"""Bucketing, misses and warmup."""

from __future__ import annotations

import pytest

from stages.buckets import Axis, Buckets
from tests.helpers import serve


@pytest.mark.parametrize(
    ("strategy", "axis", "expected"),
    [
        ("linear", Axis(min=16, step=16, max=64), [16, 32, 48, 64]),
        ("linear", Axis(min=1, step=4, max=10), [1, 5, 9, 12]),
        ("exponential", Axis(min=1, step=4, max=20), [1, 2, 4, 8, 16, 20]),
    ],
)
def test_prepared_sizes(strategy, axis, expected):
    assert axis.sizes(strategy) == expected


def test_lookup_takes_the_smallest_size_that_fits_and_counts_misses():
    buckets = Buckets("linear", {"decode_batch": Axis(1, 4, 8), "decode_blocks": Axis(1, 2, 5)})
    assert buckets.shape("decode", batch=3, blocks=2) == (5, 3)
    assert buckets.shape("decode", batch=9, blocks=1) == (12, 1)  # beyond max: a fallback
    assert buckets.misses == 1


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
    from pipeline.build import build_engine
    from tests.helpers import make_config

    engine, requests = build_engine(make_config(["max_tokens=64", "warmup=true"]))
    assert engine.warmup() > 0
    engine.run(requests)
    assert engine.metadata.bucket_misses == 0
    assert all(r.output_ids == ref[r.id].output_ids for r in requests)


def test_warmup_shapes_respect_the_budget():
    from pipeline.build import build_engine
    from tests.helpers import make_config

    engine, _ = build_engine(make_config(["max_tokens=64"]))
    phases = engine.metadata.warmup_shapes(mixed=True)
    assert set(phases) == {"prefill", "decode", "mixed"}
    assert all(p[0] * p[1] <= 64 for p, _ in phases["prefill"])
    assert all(p[0] == 1 for p, _ in phases["mixed"])


def test_a_negative_bucket_step_is_one_line_at_start():
    from pipeline.build import build_engine
    from pipeline.checks import ConfigError
    from tests.helpers import make_config

    with pytest.raises(ConfigError, match=r"^metadata.prefill_batch: need 1 <= min <= max"):
        build_engine(make_config(["metadata.prefill_batch.step=-1"]))
