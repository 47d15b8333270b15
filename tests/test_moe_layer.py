"""The routed experts of a MoE layer: experts touched and the busiest rank's share against an
independent simulation of routing, the grouped GEMMs' fixed costs by hand, their fit against
measured kernel times, and TP + EP at dp = 1 against TP alone in the measured direction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from benchmarks import moe_kernels
from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from stages.forward.step_shape import StepShape
from stages.model.spec import MoeLayout
from stages.simulator.cost_model import CostModel
from stages.simulator.expert_parallel import ExpertParallel, check_layout
from stages.simulator.moe_layer import (
    busiest_rank_experts,
    busiest_rank_pairs,
    experts_touched,
)
from tests.helpers import spec_of
from tests.test_cost_model import DEVICE, TINY, TINY_MOE


def routed(experts: int, k: int, tokens: int, ranks: int, draws: int) -> tuple[float, float]:
    """Mean over `draws` routings (k distinct experts a token, uniformly) of the most
    distinct experts and the most token-expert pairs any rank gets."""
    rng = np.random.default_rng(7)
    most_experts, most_pairs = [], []
    for _ in range(draws):
        chosen = np.argsort(rng.random((tokens, experts)), axis=1)[:, :k]
        rank = chosen // (experts // ranks)
        most_experts.append(max(len(np.unique(chosen[rank == r])) for r in range(ranks)))
        most_pairs.append(np.bincount(rank.ravel(), minlength=ranks).max())
    return float(np.mean(most_experts)), float(np.mean(most_pairs))


@pytest.mark.parametrize(
    ("experts", "k", "ranks", "tokens"),
    [(128, 8, 4, 1), (128, 8, 4, 8), (128, 8, 8, 4), (8, 2, 2, 4), (64, 6, 8, 16)],
)
def test_the_busiest_rank_matches_a_simulated_routing(experts, k, ranks, tokens):
    moe = MoeLayout(experts, k, 32, 0, frozenset({0}))
    most_experts, most_pairs = routed(experts, k, tokens, ranks, draws=400)
    assert float(busiest_rank_experts(moe, tokens, ranks)) == pytest.approx(most_experts, rel=0.1)
    assert float(busiest_rank_pairs(moe, tokens, ranks)) == pytest.approx(most_pairs, rel=0.12)


def test_one_rank_reads_every_touched_expert_and_skew_narrows_the_pool():
    moe = MoeLayout(128, 8, 32, 0, frozenset({0}))
    assert busiest_rank_experts(moe, 4, 1) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 4))
    assert busiest_rank_pairs(moe, 4, 1) == pytest.approx(32)
    # Skew 2: uniform over 64 experts.
    assert experts_touched(moe, 4, 2.0) == pytest.approx(64 * (1 - (1 - 8 / 64) ** 4))
    with pytest.raises(ValueError, match="moe_routing_skew=0.5 must be >= 1"):
        check_layout(spec_of(**TINY_MOE), 1, ExpertParallel(skew=0.5))
    with pytest.raises(ValueError, match="moe_routing_skew=5 leaves fewer than the 2"):
        check_layout(spec_of(**TINY_MOE), 1, ExpertParallel(skew=5))


def test_grouped_gemms_pay_a_fixed_time_per_layer_and_per_expert_run():
    hw = dataclasses.replace(DEVICE, moe_layer_s=3e-5, moe_expert_s=4e-7)
    decode = StepShape(16, None, (3, 3), decode_lens=(5, 5, 5))
    # TINY_MOE: one MoE layer of 8 experts, top 2; 3 tokens touch 8 (1 - (6/8)^3) of them.
    parts = CostModel(spec_of(**TINY_MOE), hw).breakdown(decode)
    assert parts["moe_fixed"] == pytest.approx(3e-5 + 8 * (1 - (6 / 8) ** 3) * 4e-7)
    assert CostModel(spec_of(**TINY), hw).breakdown(decode)["moe_fixed"] == 0


def test_the_shipped_profiles_hold_the_kernel_fit_and_it_predicts_the_held_out_model():
    hw = build(compose_config(["executor=simulated", "hardware=h100"]).hardware)
    rows = [r for r in moe_kernels.read_rows(moe_kernels.DATA) if r.batch <= moe_kernels.FIT_BATCH]
    fitted = [r for r in rows if r.model == moe_kernels.FIT_MODEL]
    layer_s, expert_s = moe_kernels.fit(fitted, hw)
    assert (hw.moe_layer_s, hw.moe_expert_s) == pytest.approx((layer_s, expert_s), rel=1e-3)
    held = [r for r in rows if r.model != moe_kernels.FIT_MODEL]
    assert max(abs(e) for e in moe_kernels.errors(held, hw, layer_s, expert_s)) < 0.1


def test_tp_with_ep_at_dp_one_decodes_slower_than_tp_alone():
    # vLLM's --enable-expert-parallel at tp=4, dp=1 measured slower than tp=4 alone on a
    # 30B-A3B MoE: whole experts on 4 ranks leave the busiest rank more expert weights to
    # read than a quarter of every touched expert, and nothing faster in exchange.
    cfg = compose_config(["executor=simulated", "hardware=h100", "model=spec/qwen3_30b_a3b"])
    spec, hw = build(cfg.model), build(cfg.hardware)
    tp_only = CostModel(spec, hw, 4)
    with_ep = CostModel(spec, hw, 4, parallel=ExpertParallel(ep=4))
    for rows in (1, 4, 8):
        shape = StepShape(32, None, (rows, rows * 32), decode_lens=(1000,) * rows)
        ratio = with_ep.step_time(shape) / tp_only.step_time(shape)
        assert 1.0 < ratio < 1.5, (rows, ratio)
