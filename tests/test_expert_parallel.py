"""Expert parallelism and data-parallel attention on the simulated device: each cost term
worked out by hand on the tiny MoE spec, what ep must leave alone, the memory a device
holds, and the engines' constraint between tp, dp and ep as one-line errors."""

from __future__ import annotations

import dataclasses
from statistics import NormalDist

import pytest

from benchmarks import published_moe
from pipeline.calibrate.published import read_rows
from pipeline.job.run import device_metrics
from stages.forward.step_shape import StepShape
from stages.simulator.cost_model import CostModel
from stages.simulator.expert_parallel import Dispatch, ExpertParallel, check_layout
from stages.simulator.hardware import GIB, kv_pool_blocks
from stages.simulator.step_work import StepWork
from tests.helpers import run_cli, serve, spec_of
from tests.test_cost_model import DEVICE, LINK, TINY, TINY_MOE

# TINY_MOE by hand: two layers' attention, layer 0's dense MLP, layer 1's router, shared
# expert and 8 routed experts of width 32 (2 a token).
ATTENTION = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64)
DENSE_MLP = 3 * 64 * 128
ROUTER = 64 * 8 + 8
EXPERT = 3 * 64 * 32
NON_ROUTED = ATTENTION + DENSE_MLP + ROUTER + EXPERT  # the shared expert is one EXPERT wide
LATENCY = 1e-5
HW = dataclasses.replace(DEVICE, allreduce_latency_s=LATENCY)
MOE_DATA = published_moe.DATA


def model(
    tp: int = 1,
    ep: int = 1,
    dp: int = 1,
    imbalance: float = 1.0,
    dispatch: Dispatch = Dispatch.allgather,
    spread: float = 0.0,  # the terms by hand: the replicas alike (the lockstep below)
    **spec,
) -> CostModel:
    layout = ExpertParallel(ep, dp, imbalance, dispatch, step_spread=spread)
    return CostModel(spec_of(**{**TINY_MOE, **spec}), HW, tp, parallel=layout)


def tokens_amounts(cost: CostModel, tokens: int):
    return cost.amounts_of(StepWork(linear_tokens=tokens, kv_writes=tokens, sampled_rows=tokens))


# The expected larger of two standard normal draws (Blom): the busiest of two ranks.
LARGER_OF_TWO = NormalDist().inv_cdf((2 - 0.375) / (2 + 0.25))


def test_expert_gemms_take_the_routed_tokens_the_busiest_rank_receives():
    # dp=2 replicas of 4 tokens each, top-2 routing, over ep=2 ranks: 2 x 4 x 2 / 2 = 8 pairs
    # a rank on average; the 16 pairs fall on a rank as draws without replacement, variance
    # 8 x 2 x 1/2 x 1/2 x (8 - 2) / (8 - 1), and the busiest rank gets the mean plus the
    # larger of two normal draws times its spread.
    pairs = 8 + LARGER_OF_TWO * (8 * 2 * 0.25 * 6 / 7) ** 0.5
    a = tokens_amounts(model(ep=2, dp=2), 4)
    assert a.linear_flops == pytest.approx(2 * 4 * NON_ROUTED + 2 * pairs * EXPERT)
    # The rank holds 4 of the 8 experts; the 8 tokens of both replicas touch, expected,
    # 8 (1 - (6/8)^8) of the 8, half of them a rank's on average, the busiest more.
    touched = 8 * (1 - (6 / 8) ** 8)
    chance = touched / 8
    busiest = min(4, touched / 2 + LARGER_OF_TWO * (4 * chance * (1 - chance)) ** 0.5)
    assert a.linear_bytes == pytest.approx((NON_ROUTED + busiest * EXPERT) * 2)


def test_imbalance_scales_only_the_routed_gemms():
    even, skewed = (
        tokens_amounts(model(ep=2, dp=2), 4),
        tokens_amounts(model(ep=2, dp=2, imbalance=1.5), 4),
    )
    pairs = 8 + LARGER_OF_TWO * (8 * 2 * 0.25 * 6 / 7) ** 0.5  # the busiest rank's
    assert skewed.linear_flops - even.linear_flops == pytest.approx(2 * pairs * EXPERT * 0.5)
    assert skewed.alltoall_bytes == even.alltoall_bytes


def test_alltoall_dispatch_and_combine_over_the_link_with_a_latency_each():
    cost = model(ep=2, dp=2)
    # Per MoE layer (one), twice: 4 tokens x 64 hidden x bf16 gathered by the other replica.
    sent = 2 * 4 * 64 * 2 * (2 - 1)
    a = tokens_amounts(cost, 4)
    assert a.alltoall_bytes == pytest.approx(sent) and a.alltoall_calls == 2
    parts = cost.breakdown(StepShape(16, None, (4, 8)))
    assert parts["alltoall"] == pytest.approx(sent / LINK)
    assert parts["alltoall_latency"] == pytest.approx(2 * LATENCY)


def test_per_expert_bytes_scale_with_k_and_each_tp_rank_sends_its_share():
    per_expert = Dispatch.per_expert
    two, four = (
        tokens_amounts(model(ep=2, dp=2, dispatch=per_expert), 4),
        tokens_amounts(model(ep=2, dp=2, dispatch=per_expert, experts_per_token=4), 4),
    )
    assert four.alltoall_bytes == pytest.approx(2 * two.alltoall_bytes)
    # tp=2 x dp=2 = ep=4: each of the replica's two ranks sends half its tokens' k=2
    # copies, 3/4 of them leaving.
    tp2 = tokens_amounts(model(tp=2, ep=4, dp=2, dispatch=per_expert), 4)
    assert tp2.alltoall_bytes == pytest.approx(2 * 2 * 64 * 2 * 2 * 3 / 4)


def test_an_all_gather_sends_every_token_to_the_other_replicas_whatever_k():
    two, four = (
        tokens_amounts(model(ep=4, dp=4), 4),
        tokens_amounts(model(ep=4, dp=4, experts_per_token=4), 4),
    )
    assert two.alltoall_bytes == four.alltoall_bytes == pytest.approx(2 * 4 * 64 * 2 * 3)
    # One replica (dp=1, experts over its tp ranks): nothing to gather, no call paid.
    alone = tokens_amounts(model(tp=2, ep=2, dp=1), 4)
    assert alone.alltoall_bytes == 0 and alone.alltoall_calls == 0


def test_per_rank_dispatch_sends_a_token_once_to_each_rank_holding_its_experts():
    # 8 experts, k=2, ep=2: the other rank holds 4, none of a token's 2 with probability
    # C(4, 2) / C(8, 2) = 6 / 28.
    a = tokens_amounts(model(ep=2, dp=2, dispatch=Dispatch.per_rank), 4)
    assert a.alltoall_bytes == pytest.approx(2 * 4 * 64 * 2 * (1 - 6 / 28))


def test_with_k_equal_to_ep_per_expert_sends_as_much_as_an_all_gather():
    shape = StepShape(16, (1, 64, 4), (4, 8))
    gather = model(ep=4, dp=4, experts_per_token=4).breakdown(shape)
    per_expert = model(ep=4, dp=4, experts_per_token=4, dispatch=Dispatch.per_expert)
    assert per_expert.breakdown(shape)["alltoall"] == pytest.approx(gather["alltoall"])


def test_all_to_all_links_give_a_rank_its_peers_links():
    cost = CostModel(
        spec_of(**TINY_MOE),
        dataclasses.replace(HW, interconnect_peer_gbs=10.0),
        1,
        parallel=ExpertParallel(4, 4, step_spread=0.0),
    )
    parts = cost.breakdown(StepShape(16, None, (4, 8)))
    sent = 2 * 4 * 64 * 2 * 3  # each token gathered by the 3 other replicas
    assert parts["alltoall"] == pytest.approx(sent / (3 * 10e9))  # 3 peers' links, < 50 GB/s


def test_ep_leaves_attention_kv_and_the_lm_head_alone():
    shape = StepShape(16, (2, 64, 4), (4, 8))
    plain, ep = model().breakdown(shape), model(ep=8, dp=8).breakdown(shape)
    for term in ("prefill_attention", "decode_attention", "kv_write", "lm_head", "kv_blocks"):
        assert ep[term] == plain[term], term
    assert ep["allreduce"] == plain["allreduce"] == 0  # tp=1: no all-reduce either way
    assert plain["alltoall"] == plain["alltoall_latency"] == 0


def test_ep_1_dp_1_is_the_cost_model_without_a_layout():
    shape = StepShape(16, (2, 64, 4), (4, 8))
    for spec in (TINY, TINY_MOE):
        without = CostModel(spec_of(**spec), HW, 2)
        with_plain = CostModel(spec_of(**spec), HW, 2, parallel=ExpertParallel(1, 1))
        assert with_plain.breakdown(shape) == without.breakdown(shape)
        assert with_plain.step_time(shape) == without.step_time(shape)


def test_dense_models_run_dp_replicas_unchanged():
    shape = StepShape(16, (2, 64, 4), (4, 8))
    one = CostModel(spec_of(**TINY), HW, 1)
    replicas = CostModel(spec_of(**TINY), HW, 1, parallel=ExpertParallel(1, 4))
    assert replicas.step_time(shape) == one.step_time(shape)


def test_a_device_holds_its_share_of_the_experts_and_its_replicas_kv():
    spec = spec_of(**TINY_MOE)
    total = spec.num_parameters()
    routed = 8 * EXPERT  # one MoE layer
    for ep in (2, 4, 8):
        weights = (total - routed + routed / ep) * 2
        free = 1 * GIB * (1 - 0.25) - weights - 0.25 * GIB
        kv_per_token = 2 * 2 * 2 * 16 * 2  # the replica's KV at tp=1, whatever dp
        got = kv_pool_blocks(spec, HW, 16, 1, parallel=ExpertParallel(ep, ep))
        assert got == int(free // (16 * kv_per_token))


@pytest.mark.parametrize(
    ("spec", "tp", "ep", "dp", "message"),
    [
        (TINY, 1, 2, 2, "ep=2: tiny is dense"),
        (TINY_MOE, 1, 4, 2, r"ep=4 must equal tp x dp = 1 x 2 = 2"),
        (TINY_MOE, 1, 1, 2, "dp=2 with ep=1 on tiny"),
        (dict(TINY_MOE, num_experts=6), 1, 4, 4, "ep=4 does not divide tiny's 6 experts"),
        (TINY_MOE, 1, 0, 1, "ep=0 and dp=1 must each be >= 1"),
    ],
)
def test_impossible_layouts_are_one_line_errors(spec, tp, ep, dp, message):
    with pytest.raises(ValueError, match=message):
        check_layout(spec_of(**spec), tp, ExpertParallel(ep, dp))


@pytest.mark.parametrize(
    "keys, message",
    [
        (["ep=4", "dp=2"], "Error: ep=4 must equal tp x dp = 1 x 2 = 2"),
        (["ep=2", "dp=2", "dp_step_spread=-1"], "Error: dp_step_spread=-1.0 must be >= 0"),
    ],
)
def test_an_impossible_layout_exits_2_naming_the_keys(tmp_path, keys, message):
    result = run_cli(
        tmp_path, "pipeline", "executor=simulated", "hardware=gaudi3",
        "model=spec/qwen3_30b_a3b", *keys, "workload.num_requests=2",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(message)


def test_a_run_with_ep_and_dp_holds_its_share_and_says_so():
    _, engine = serve(
        [
            "executor=simulated", "hardware=gaudi3", "model=spec/ernie45_300b_a47b",
            "ep=8", "dp=8", "quantization=fp8", "workload.num_requests=4",
            "workload.max_prompt_tokens=64", "workload.max_new_tokens=4",
        ]
    )  # fmt: skip
    metrics = device_metrics(engine)
    assert (metrics["tp"], metrics["ep"], metrics["dp"]) == (1, 8, 8)
    spec, hardware = engine.model.spec, engine.model.hardware
    layout, precision = engine.model.cost.parallel, engine.model.precision
    bs = engine.scheduler.kv_cache.block_size
    pool = kv_pool_blocks(spec, hardware, bs, 1, precision, layout)
    assert engine.scheduler.kv_cache.num_blocks == pool
    # ERNIE-4.5-300B on one Gaudi 3 holds no KV without expert parallelism.
    with pytest.raises(ValueError, match="leaves no KV cache"):
        kv_pool_blocks(spec, hardware, bs, 1, precision)


def test_the_published_moe_rows_read_with_their_layouts_and_simulate():
    rows, layouts = read_rows(MOE_DATA), published_moe.layouts(str(MOE_DATA))
    assert len(rows) == len(layouts) == 17
    assert all(r.source and r.where and r.model_preset == "qwen3_235b_a22b" for r in rows)
    assert {(lay.ep, lay.dp) for lay in layouts} == {(8, 8)}
    short = next(
        r
        for r in rows
        if r.hardware == "h200" and r.input_tokens == 2048 and r.output_tokens == 128
    )
    run = published_moe.simulate_replica(short, layouts[0])
    # dp replicas, each its 1 / dp of the requests: dp x the replica's output rate.
    assert run.output_tokens == 375 * 128
    assert run.predicted == pytest.approx(8 * run.output_tokens / run.duration_s)


def test_a_step_of_replicas_in_lockstep_waits_for_the_slowest():
    # dp replicas' step times spread by `step_spread` about the simulated one's: every part
    # of a MoE step takes 1 + spread x the expected largest of dp standard normals as long.
    shape = StepShape(16, None, (4, 8))
    alike = model(ep=4, dp=4).breakdown(shape)
    spread = model(ep=4, dp=4, spread=0.5).breakdown(shape)
    largest_of_four = NormalDist().inv_cdf((4 - 0.375) / (4 + 0.25))
    assert largest_of_four == pytest.approx(1.0491, abs=1e-3)
    for term, seconds in alike.items():
        assert spread[term] == pytest.approx(seconds * (1 + 0.5 * largest_of_four)), term
    lockstep = model(ep=4, dp=4, spread=0.5)
    assert lockstep.step_time(shape) == pytest.approx(sum(spread.values()))
    # One replica waits for none; a dense model's dp replicas are independent.
    assert model(spread=0.5).breakdown(shape) == model().breakdown(shape)
    dense = CostModel(spec_of(**TINY), HW, 1, parallel=ExpertParallel(1, 4, step_spread=0.5))
    assert dense.breakdown(shape) == CostModel(spec_of(**TINY), HW, 1).breakdown(shape)
    with pytest.raises(ValueError, match="dp_step_spread=-0.1 must be >= 0"):
        check_layout(spec_of(**TINY_MOE), 1, ExpertParallel(4, 4, step_spread=-0.1))


def test_a_run_in_lockstep_takes_its_time_at_no_spread_times_the_lockstep():
    # What fit_step_spread rests on: with every request queued at the start the schedule
    # does not depend on the steps' times, so a run's throughput scales by 1 / lockstep.
    rows = published_moe.moe_rows(str(published_moe.STATED))
    short = next(r for r in rows if r.row.hardware == "h200" and r.row.output_tokens == 1024)
    row = dataclasses.replace(short.row, num_requests=40)
    alike = published_moe.simulate_replica(row, dataclasses.replace(short.layout, step_spread=0))
    spread = published_moe.simulate_replica(row, short.layout)
    assert short.layout.lockstep > 1.3
    assert spread.predicted == pytest.approx(alike.predicted / short.layout.lockstep, rel=1e-9)


def test_the_fit_finds_the_spread_the_rows_were_made_with(monkeypatch):
    # Rows whose published figures are what the device predicts at no spread over the
    # lockstep of a known spread (0.3) at their dp: the fit gives that spread back.
    rows = published_moe.attention_dp_rows()
    known = 0.3

    def predicted(row, layout):
        assert layout.step_spread == 0
        lockstep = dataclasses.replace(layout, step_spread=known).lockstep
        return dataclasses.replace(RUN, row=row, predicted=row.value * lockstep)

    RUN = published_moe.RowRun(rows[0].row, 0.0, 1.0, 1, 1, 0.0, 0.0, None)  # type: ignore[arg-type]
    monkeypatch.setattr(published_moe, "simulate_replica", predicted)
    assert {r.layout.dp for r in rows} == {4, 8}
    assert published_moe.fit_step_spread(rows) == pytest.approx(known, abs=1e-4)


def test_the_attention_dp_rows_state_their_layout_and_split():
    stated = published_moe.moe_rows(str(published_moe.STATED))
    assert {(r.row.hardware, r.layout.ep, r.layout.dp) for r in stated} == {
        ("h200", 4, 4),
        ("h100", 8, 8),
    }
    assert all("DEP" in r.row.method and r.split == "held_out" for r in stated)
    v1 = published_moe.moe_rows(str(MOE_DATA))
    assert {r.split for r in v1 if r.row.hardware == "h200"} == {"fit"}
    assert {r.split for r in v1 if r.row.hardware == "h100"} == {"held_out"}
