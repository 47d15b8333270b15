"""Every paged, chunked, padded configuration must reproduce the dense reference."""

from __future__ import annotations

import numpy as np
import pytest

from stages.forward.forward_meta import bucket_dims
from tests.helpers import serve

CASES = {
    "chunked, budget of one block": ["max_tokens=16"],
    "chunked, two blocks": ["max_tokens=32"],
    "chunked, budget 4096": ["max_tokens=4096"],
    "whole prompts": ["scheduler=whole", "max_tokens=4096"],
}


def assert_matches(reference_run, got, engine) -> None:
    ref, ref_engine = reference_run
    assert set(got) == set(ref)
    for rid, request in got.items():
        assert request.finish_reason == ref[rid].finish_reason != "error"
        assert request.output_ids == ref[rid].output_ids, rid
    keys = ref_engine.sampler.logits.keys()
    assert keys == engine.sampler.logits.keys()
    worst = max(np.abs(engine.sampler.logits[k] - ref_engine.sampler.logits[k]).max() for k in keys)
    assert worst < 1e-4


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_greedy_tokens_and_logits_match_reference(reference_run, overrides):
    got, engine = serve(overrides, record_logits=True)
    assert_matches(reference_run, got, engine)


def test_chunking_really_happens():
    """The budget-16 case only proves something if prompts were split and steps mixed."""
    steps = []
    serve(["max_tokens=32"], steps=steps)
    assert any(c["start"] > 0 for s in steps for c in s.prefill)
    assert "mixed" in {s.mode for s in steps}


def chunks_cut_at_blocks_of(size: int):
    """Prompts longer than the budget were cut into chunks of whole `size`-token blocks."""

    def check(steps, engine) -> bool:
        return any(c["start"] > 0 and c["start"] % size == 0 for s in steps for c in s.prefill)

    return check


def whole_prompts_in_one_block_of(size: int):
    """Every prompt was prefilled whole, in a single block of `size` tokens."""

    def check(steps, engine) -> bool:
        chunks = [c for s in steps for c in s.prefill]
        return bool(chunks) and all(c["start"] == 0 and c["end"] <= size for c in chunks)

    return check


def exponential_decode_buckets(steps, engine) -> bool:
    """Decode steps padded to power-of-two buckets, batches above one among them (linear
    buckets of step 4 from 1 give 1, 5, 9, ...)."""
    decodes = [bucket_dims(s.bucket)[1] for s in steps]
    dims = [d for d in decodes if d is not None]
    powers = all(n & (n - 1) == 0 for d in dims for n in d)
    return powers and any(d[0] > 1 for d in dims)


def warmup_ran(steps, engine) -> bool:
    """Warmup ran every prepared shape before serving, so no step missed the buckets."""
    return engine.warmed_shapes > 0 and engine.metadata.bucket_misses == 0


def partial_prefills_with_different_contexts(rows: int):
    """Rows with `rows` different, non-zero context lengths shared a step (flaw 3)."""

    def check(steps, engine) -> bool:
        return any(len({c["start"] for c in s.prefill if c["start"] > 0}) >= rows for s in steps)

    return check


def mixed_steps(steps, engine) -> bool:
    return "mixed" in {s.mode for s in steps}


def extend_only_steps(steps, engine) -> bool:
    return "extend" in {s.mode for s in steps}


def one_block_chunks(steps, engine) -> bool:
    return any(not c["start"] and c["end"] == 16 for s in steps for c in s.prefill)


def unaligned_chunk_starts(steps, engine) -> bool:
    return any(c["start"] % 16 for s in steps for c in s.prefill)


HPU_CASES = {
    "block size 64": (["block_size=64", "max_tokens=64"], chunks_cut_at_blocks_of(64)),
    "block size 128": (["block_size=128", "max_tokens=128"], whole_prompts_in_one_block_of(128)),
    "exponential buckets": (
        ["metadata.bucketing=exponential", "max_tokens=48"],
        exponential_decode_buckets,
    ),
    "unaligned chunks": (
        ["scheduler.align_chunks=false", "scheduler.budget=real", "max_tokens=21"],
        unaligned_chunk_starts,
    ),
    "two partial prefills": (
        ["max_tokens=64", "scheduler.long_prefill_threshold=16"],
        partial_prefills_with_different_contexts(2),
    ),
    "three partial prefills": (
        ["max_tokens=52", "scheduler.long_prefill_threshold=16"],
        partial_prefills_with_different_contexts(3),
    ),
    "chunks of one block": (["max_tokens=16"], one_block_chunks),
    "mixed steps": (["max_tokens=48"], mixed_steps),
    "extend-only and decode-only steps": (
        ["max_tokens=4096", "scheduler=whole"],
        extend_only_steps,
    ),
    "real-token budget": (["max_tokens=40", "scheduler.budget=real"], mixed_steps),
    "decode blocks listed row by row": (["max_tokens=48", "metadata.decode_span=0"], mixed_steps),
    "decode spans of any width": (["max_tokens=48", "metadata.decode_span=1000"], mixed_steps),
    "warmup first": (["max_tokens=64", "warmup=true"], warmup_ran),
    "exponential buckets, block size 64": (
        ["metadata.bucketing=exponential", "block_size=64", "max_tokens=128"],
        exponential_decode_buckets,
    ),
}


@pytest.mark.parametrize(("overrides", "shape_check"), HPU_CASES.values(), ids=HPU_CASES.keys())
def test_hpu_layouts_match_reference(reference_run, overrides, shape_check):
    steps = []
    got, engine = serve(overrides, record_logits=True, steps=steps)
    assert_matches(reference_run, got, engine)
    assert "decode" in {s.mode for s in steps}
    assert shape_check(steps, engine), "the case did not produce the step shape it targets"


def test_reference_differs_when_model_differs(reference_run):
    """The comparison can fail: another weight seed gives other tokens."""
    ref, _ = reference_run
    other, _ = serve(["model.seed=1"])
    assert any(other[rid].output_ids != ref[rid].output_ids for rid in ref)


def test_preempted_requests_match_reference():
    grow = ["workload.num_requests=8", "workload.min_new_tokens=20", "workload.max_new_tokens=40"]
    ref, _ = serve([*grow, "attention=reference", "scheduler=whole", "max_tokens=4096"])
    got, engine = serve([*grow, "max_tokens=64", "num_blocks=10"])
    assert sum(r.num_preemptions for r in got.values()) >= 2, "the pool did not force preemption"
    for rid, request in got.items():
        assert request.output_ids == ref[rid].output_ids, rid
    assert engine.scheduler.kv_cache.num_free_blocks == 10
