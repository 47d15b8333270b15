"""Speculative decoding on the simulated device: each cost term by hand, the expected tokens
by hand, and the properties the papers state (acceptance 0 never gains; the gain falls as
the batch grows; at acceptance 1 and batch 1 a token costs step_time(k + 1) / (k + 1))."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from pipeline.executors.paddle import PaddleExecutor
from pipeline.speculation.keys import draft_spec, speculation_of
from stages.forward.step_shape import StepShape
from stages.simulator.precision import BF16
from stages.simulator.speculative import (
    Speculation,
    SpeculativeCost,
    accepted_extra,
    expected_tokens,
    pool_with_proposer,
    proposer_memory,
)
from tests.helpers import make_config, spec_of
from tests.test_cost_model import (
    BANDWIDTH,
    FLOPS,
    KV_BYTES_PER_TOKEN,
    LINEAR_PARAMS,
    LM_HEAD_PARAMS,
    TINY,
    tiny_model,
)

SIMULATED = ["executor=simulated", "model=spec/llama31_8b", "max_model_len=1024"]


def test_expected_tokens_by_hand():
    assert expected_tokens([0.8], 1) == pytest.approx(1.8)
    # 1 + 0.8 + 0.8 x 0.5 + 0.8 x 0.5 x 0.5: the last value repeats
    assert expected_tokens([0.8, 0.5], 3) == pytest.approx(2.4)
    assert expected_tokens([0.0], 4) == 1.0
    assert expected_tokens([1.0], 4) == 5.0
    # a share 0.25 of rows proposes: 1 + 0.25 x (0.8 + 0.8 x 0.5 + 0.8 x 0.5 x 0.5)
    assert expected_tokens([0.8, 0.5], 3, proposal_rate=0.25) == pytest.approx(1.35)


@given(st.floats(1.0, 6.0), st.integers(1, 300))
def test_fractional_credit_hands_out_the_expected_tokens(expected, steps):
    extras = [accepted_extra(n, expected) for n in range(1, steps + 1)]
    assert sum(extras) == int(np.floor(steps * (expected - 1) + 1e-9))
    assert all(np.floor(expected - 1) <= e <= np.ceil(expected - 1) for e in extras)


def _cost(method: str, tokens: int, draft=None) -> SpeculativeCost:
    return SpeculativeCost(tiny_model(), Speculation(method, tokens, (0.8,)), draft)


def test_verification_terms_by_hand():
    # 4 rows over a bucket of 8 blocks of 16 slots (128), k = 2: 12 tokens through the
    # GEMMs and the lm head, 12 KV writes; attention: 3 x 128 + 4 x (1 + 2) = 396 query-key
    # pairs (4 FLOPs x 4 heads x 16 wide x 2 layers each), the 128 slots read once.
    shape = StepShape(block_size=16, prefill=None, decode=(4, 8))
    model = tiny_model()
    fill = model.hardware.gemm_fill_s
    linear = max(2 * 12 * LINEAR_PARAMS / FLOPS + 8 * fill, 2 * LINEAR_PARAMS / BANDWIDTH)
    attention = max(396 * 4 * 4 * 16 * 2 / FLOPS, 128 * KV_BYTES_PER_TOKEN / BANDWIDTH)
    assert attention == 128 * KV_BYTES_PER_TOKEN / BANDWIDTH  # the keys, read once
    writes = 12 * KV_BYTES_PER_TOKEN / BANDWIDTH
    head = max(2 * 12 * LM_HEAD_PARAMS / FLOPS, 2 * LM_HEAD_PARAMS / BANDWIDTH)
    expected = linear + attention + writes + head + 0.001
    assert _cost("ngram", 2).verify_seconds(shape) == pytest.approx(expected)
    assert _cost("ngram", 2).step_time(shape) == pytest.approx(expected)  # no proposal cost


def test_mtp_pass_is_one_layer_and_the_lm_head_by_hand():
    shape = StepShape(block_size=16, prefill=None, decode=(4, 8))
    fill = tiny_model().hardware.gemm_fill_s
    # One of the 2 layers: its GEMMs (4 tokens), 128 slots read and 4 written; the lm head.
    linear = max(2 * 4 * LINEAR_PARAMS / FLOPS + 8 * fill, 2 * LINEAR_PARAMS / BANDWIDTH)
    layer = (linear + 132 * KV_BYTES_PER_TOKEN / BANDWIDTH) / 2
    head = max(2 * 4 * LM_HEAD_PARAMS / FLOPS, 2 * LM_HEAD_PARAMS / BANDWIDTH)
    cost = _cost("mtp", 3)
    assert cost.propose_seconds(shape) == pytest.approx(3 * (layer + head))
    assert cost.step_time(shape) == pytest.approx(cost.verify_seconds(shape) + 3 * (layer + head))


def test_draft_passes_are_the_draft_models_decode_steps():
    shape = StepShape(block_size=16, prefill=(1, 32, 2), decode=(4, 8))
    draft = spec_of(**dict(TINY, num_layers=1, name="draft"))
    cost = _cost("draft", 2, draft)
    one = SpeculativeCost(tiny_model(), Speculation("ngram", 1, (0.8,)))
    assert one.draft is None and cost.draft is not None
    decode_only = StepShape(16, None, (4, 8))
    assert cost.propose_seconds(shape) == pytest.approx(2 * cost.draft.step_time(decode_only))
    # A prefill-only step proposes nothing and verifies nothing more.
    prefill = StepShape(16, (1, 32, 2), None)
    assert cost.step_time(prefill) == pytest.approx(tiny_model().step_time(prefill))


def test_a_proposal_rate_verifies_its_share_of_the_rows_by_hand():
    # test_verification_terms_by_hand's step on a device that computes real tokens, half
    # of its 4 rows (32 slots each) proposing: 2 x 2 = 4 proposals through the GEMMs and the
    # lm head (8 tokens with the rows' own), 4 KV writes besides the rows' 4; attention
    # 128 + 2 x 64 + 2 x (1 + 2) = 262 query-key pairs: the 128 slots read once bound it.
    shape = StepShape(block_size=16, prefill=None, decode=(4, 8), decode_lens=(32,) * 4)
    model = tiny_model(pads_to_buckets=False)
    fill = model.hardware.gemm_fill_s
    linear = max(2 * 8 * LINEAR_PARAMS / FLOPS + 8 * fill, 2 * LINEAR_PARAMS / BANDWIDTH)
    attention = max(262 * 4 * 4 * 16 * 2 / FLOPS, 128 * KV_BYTES_PER_TOKEN / BANDWIDTH)
    writes = 8 * KV_BYTES_PER_TOKEN / BANDWIDTH
    head = max(2 * 8 * LM_HEAD_PARAMS / FLOPS, 2 * LM_HEAD_PARAMS / BANDWIDTH)
    half = SpeculativeCost(model, Speculation("ngram", 2, (0.8,), proposal_rate=0.5))
    assert half.verify_seconds(shape) == pytest.approx(linear + attention + writes + head + 0.001)


def test_a_padding_device_verifies_every_row_whatever_the_rate():
    shape = StepShape(block_size=16, prefill=None, decode=(4, 8))
    model = tiny_model(pads_to_buckets=True)
    every = SpeculativeCost(model, Speculation("ngram", 2, (0.8,)))
    some = SpeculativeCost(model, Speculation("ngram", 2, (0.8,), proposal_rate=0.2))
    assert some.verify_seconds(shape) == every.verify_seconds(shape)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_a_proposal_rate_outside_0_1_is_a_one_line_error(rate):
    cfg = make_config([*SIMULATED, "speculative.method=ngram", f"speculative.proposal_rate={rate}"])
    with pytest.raises(ConfigError, match=f"speculative.proposal_rate={rate}: .* in \\(0, 1\\]"):
        speculation_of(cfg)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    st.integers(1, 6),
    st.sampled_from(["mtp", "ngram"]),
    st.booleans(),
)
def test_a_verification_step_never_costs_less_than_a_plain_one(lens, k, method, pads):
    model = tiny_model(pads_to_buckets=pads)
    blocks = sum(-(-n // 16) for n in lens)
    shape = StepShape(16, None, (len(lens), blocks), decode_lens=tuple(lens))
    cost = SpeculativeCost(model, Speculation(method, k, (0.0,)))
    assert cost.step_time(shape) >= model.step_time(shape)


def _served(overrides: list[str]) -> tuple[float, list]:
    """The run's mean TPOT (seconds) and its requests."""
    engine, requests = build_engine(make_config(SIMULATED + overrides))
    engine.run(requests)
    tpots = [
        (r.token_times[-1] - r.token_times[0]) / (len(r.output_ids) - 1)
        for r in requests
        if len(r.output_ids) > 1
    ]
    return float(np.mean(tpots)), requests


def _load(concurrency: int, new_tokens: int = 64) -> list[str]:
    return [
        "hardware=h100",
        f"workload.num_requests={2 * concurrency}",
        f"workload.concurrency={concurrency}",
        f"max_num_seqs={concurrency}",
        "workload.min_prompt_tokens=32",
        "workload.max_prompt_tokens=64",
        f"workload.min_new_tokens={new_tokens}",
        f"workload.max_new_tokens={new_tokens}",
        "max_tokens=4096",
    ]


@pytest.mark.parametrize("method", ["mtp", "ngram"])
@pytest.mark.parametrize("hardware", ["h100", "gaudi3"])
def test_acceptance_zero_is_never_faster_and_keeps_the_output_lengths(method, hardware):
    load = [*_load(4, 40), f"hardware={hardware}"]
    plain, _ = _served(load)
    spec = [f"speculative.method={method}", "speculative.tokens=3", "speculative.acceptance=[0]"]
    slower, requests = _served(load + spec)
    assert slower >= plain
    assert all(len(r.output_ids) == r.max_new_tokens for r in requests)


def test_accepted_tokens_keep_the_workloads_output_lengths():
    spec = ["speculative.method=mtp", "speculative.tokens=3", "speculative.acceptance=[0.9,0.7]"]
    _, requests = _served(_load(4, 37) + spec)
    assert all(len(r.output_ids) == r.max_new_tokens == 37 for r in requests)


def test_the_speed_up_falls_as_the_batch_grows():
    spec = ["speculative.method=mtp", "speculative.tokens=2", "speculative.acceptance=[0.8]"]
    gains = []
    for concurrency in (1, 64, 256):
        plain, _ = _served(_load(concurrency, 24))
        fast, _ = _served(_load(concurrency, 24) + spec)
        gains.append(plain / fast)
    assert gains[0] > gains[1] > gains[2]
    assert gains[0] > 1.5  # memory-bound at batch 1: close to E = 2.44 less the head's cost


def test_full_acceptance_at_batch_one_costs_a_k_plus_one_step_per_k_plus_one_tokens():
    k, new = 3, 1 + 4 * 50  # the prefill's token, then 50 steps of 4
    load = [*_load(1, new), "workload.num_requests=1", "workload.min_prompt_tokens=64"]
    spec = ["speculative.method=ngram", f"speculative.tokens={k}", "speculative.acceptance=[1]"]
    tpot, (request,) = _served(load + spec)
    cfg = make_config(SIMULATED + load + spec)
    engine, _ = build_engine(cfg)
    cost = engine.simulation.device.speculative
    # Steps' lengths grow by 4 from prompt + 1; a step's time is affine in its slots, so
    # the mean step is the one at the mean length.
    start = request.num_prompt_tokens + 1
    mean_len = start + 4 * 49 / 2
    shape = StepShape(cfg.block_size, None, (1, 4), decode_lens=(round(mean_len),))
    assert tpot == pytest.approx(cost.step_time(shape) / (k + 1), rel=5e-3)


def test_decode_rows_hold_kv_for_their_k_plus_one_slots():
    k = 4
    spec = ["speculative.method=mtp", f"speculative.tokens={k}", "speculative.acceptance=[0.5]"]
    engine, requests = build_engine(make_config(SIMULATED + _load(8, 40) + spec))
    scheduler = engine.scheduler
    for r in requests[:8]:
        scheduler.add(r)
    for _ in range(30):
        plan = scheduler.schedule(0.0)
        held = scheduler.kv_cache.slots_held(plan.decode)
        # A decode row's computed tokens are all but its last: num_tokens - 1.
        assert all(h >= r.num_tokens + k for h, r in zip(held, plan.decode, strict=True))
        engine._run(plan, engine.metadata.build(plan))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("speculative.tokens=0", "speculative.tokens"),
        ("speculative.acceptance=[0.5,1.5]", "speculative.acceptance"),
        ("speculative.acceptance=[]", "speculative.acceptance"),
        ("speculative.acceptance=abc", "speculative.acceptance=abc: give a number"),
        ("speculative.acceptance=[0.5,x]", "speculative.acceptance"),
        ("speculative.mtp_layers=0", "speculative.mtp_layers"),
        ("speculative.draft_model=spec/llama32_1b", "speculative.draft_model"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(override, key):
    cfg = make_config([*SIMULATED, "speculative.method=mtp", override])
    with pytest.raises(ConfigError, match=key) as err:
        speculation_of(cfg)
    assert "\n" not in str(err.value)


def test_one_acceptance_value_is_every_positions():
    """speculative.acceptance=0.8, as the engines' docs and a sweep write it, is [0.8]."""
    spec = ["speculative.method=mtp", "speculative.tokens=3"]
    one = speculation_of(make_config([*SIMULATED, *spec, "speculative.acceptance=0.8"]))
    listed = speculation_of(make_config([*SIMULATED, *spec, "speculative.acceptance=[0.8]"]))
    assert one == listed and one is not None and one.acceptance == (0.8,)


def test_a_draft_needs_its_model_and_the_preset_must_exist():
    cfg = make_config([*SIMULATED, "speculative.method=draft"])
    with pytest.raises(ConfigError, match="speculative.draft_model"):
        speculation_of(cfg)
    with pytest.raises(ConfigError, match="speculative.draft_model=spec/nothing"):
        draft_spec("spec/nothing")
    small = draft_spec("spec/llama32_1b")
    assert 1.1e9 < small.num_parameters() < 1.3e9  # the published 1.24B


def test_the_real_path_refuses_speculation():
    cfg = make_config(["speculative.method=ngram"])
    with pytest.raises(ConfigError, match="speculative.method=ngram is simulated only"):
        PaddleExecutor().check(cfg)


def test_metrics_name_the_speculation():
    spec = ["speculative.method=mtp", "speculative.tokens=2", "speculative.acceptance=[0.5]"]
    engine, _ = build_engine(make_config(SIMULATED + _load(1, 8) + spec))
    metrics = engine.simulation.metrics(0)
    assert metrics["speculative_method"] == "mtp"
    assert metrics["speculative_expected_tokens"] == pytest.approx(1.75)
    assert dataclasses.is_dataclass(engine.simulation.device.speculative.speculation)


def test_the_proposers_memory_by_hand():
    target, draft = spec_of(**TINY), spec_of(**dict(TINY, num_layers=1, name="draft"))
    mtp = Speculation("mtp", 2, (0.8,))
    weights, kv = proposer_memory(mtp, target, None, 1, BF16)
    assert weights == pytest.approx(BF16.model_weight_bytes(target) / 2)  # 1 of 2 layers
    assert kv == pytest.approx(KV_BYTES_PER_TOKEN / 2)
    weights, kv = proposer_memory(Speculation("draft", 2, (0.8,)), target, draft, 1, BF16)
    assert (weights, kv) == (BF16.model_weight_bytes(draft), KV_BYTES_PER_TOKEN / 2)
    assert proposer_memory(Speculation("ngram", 2, (0.8,)), target, None, 1, BF16) == (0, 0)
    # 100 blocks of 16 tokens x 1000 B = 1.6 MB; 160 kB of weights out, 1250 B a token.
    assert pool_with_proposer(100, 16, 1000.0, 160_000.0, 250.0) == 72
    with pytest.raises(ValueError, match="speculative.draft_model"):
        pool_with_proposer(1, 16, 1000.0, 1e9, 0.0)


def test_a_draft_model_takes_its_memory_from_the_kv_pool():
    pools = {}
    for method in ("none", "ngram", "draft"):
        spec = [f"speculative.method={method}"]
        if method == "draft":
            spec.append("speculative.draft_model=spec/llama32_1b")
        engine, _ = build_engine(make_config(SIMULATED + _load(1, 8) + spec))
        pools[method] = engine.scheduler.kv_cache.num_blocks
    assert pools["ngram"] == pools["none"] > pools["draft"]


def test_leaps_are_off_under_speculation_so_a_leaping_run_is_the_stepped_one():
    spec = ["speculative.method=mtp", "speculative.tokens=2", "speculative.acceptance=[0.7]"]
    times = []
    for leaping in (False, True):
        engine, requests = build_engine(make_config(SIMULATED + _load(4, 30) + spec))
        leapt = []
        duration = engine.run(requests, on_run=leapt.append if leaping else None)
        assert not leapt
        times.append((duration, [r.token_times for r in requests]))
    assert times[0] == times[1]
