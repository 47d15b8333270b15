"""Draft shapes (vLLM's chain, SGLang's tree) and an EAGLE head's passes: the keys' checks,
the tokens a row can accept, and each pass's cost by hand."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from stages.forward.step_shape import StepShape
from stages.simulator.cost_model import CostModel
from stages.simulator.draft_tree import DraftTree, tree_of
from stages.simulator.speculative import Speculation, SpeculativeCost, expected_tokens


def test_chain_from_tokens_and_tree_from_steps():
    assert tree_of(3, 0, 0, 0) == DraftTree(3, 1, 4, chain=True)
    tree = tree_of(1, 5, 8, 32)
    assert (tree.steps, tree.topk, tree.draft_tokens, tree.chain) == (5, 8, 32, False)
    # A row accepts along one path: at most min(steps, draft_tokens - 1) draft tokens.
    assert tree.depth == 5 and tree_of(1, 5, 8, 4).depth == 3


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ((1, 3, 1, 6), "speculative.draft_tokens=6 with speculative.topk=1"),
        ((1, 2, 4, 30), "2 steps of topk 4 draft at most 21 tokens"),
        ((1, 0, 4, 0), "set speculative.steps too"),
        ((1, 3, 2, 1), "speculative.draft_tokens=1: a row verifies"),
    ],
)
def test_shapes_no_engine_runs_are_refused(keys, message):
    with pytest.raises(ValueError, match=message):
        tree_of(*keys)


def test_a_tree_is_an_eagle_heads():
    with pytest.raises(ValueError, match="set speculative.method=eagle"):
        Speculation("mtp", 1, (0.8,), steps=3, topk=2, draft_tokens=6)


def test_expected_tokens_follow_the_trees_depth():
    tree = Speculation("eagle", 1, (0.8, 0.6), steps=5, topk=8, draft_tokens=4)
    assert tree.verified == 3
    assert tree.expected_tokens == pytest.approx(expected_tokens((0.8, 0.6), 3))


def eagle_cost(pass_s: float, **keys) -> SpeculativeCost:
    cfg = compose_config(["executor=simulated", "hardware=h100", "model=spec/llama31_8b"])
    hw = dataclasses.replace(build(cfg.hardware), draft_pass_s=pass_s)
    return SpeculativeCost(CostModel(build(cfg.model), hw), Speculation("eagle", **keys))


@pytest.mark.parametrize(
    ("keys", "passes"),
    [
        (dict(tokens=3, acceptance=(0.7,)), 3),  # vLLM: k passes
        (dict(tokens=1, acceptance=(0.7,), steps=5, topk=4, draft_tokens=8), 5),  # extend + 4
    ],
)
def test_each_pass_pays_the_devices_fixed_time(keys, passes):
    decode = StepShape(32, None, (4, 4 * 32), decode_lens=(1000,) * 4)
    base, more = eagle_cost(0.0, **keys), eagle_cost(1e-4, **keys)
    assert more.propose_seconds(decode) - base.propose_seconds(decode) == pytest.approx(
        passes * 1e-4
    )


def test_verification_takes_the_trees_draft_tokens():
    decode = StepShape(32, None, (4, 4 * 32), decode_lens=(1000,) * 4)
    tree = eagle_cost(0.0, tokens=1, acceptance=(0.7,), steps=7, topk=2, draft_tokens=8)
    chain = eagle_cost(0.0, tokens=7, acceptance=(0.7,))
    assert tree.verify_seconds(decode) == pytest.approx(chain.verify_seconds(decode))
    # A head's pass over the rows costs far less than the target's step.
    target = tree.target.step_time(decode)
    assert 0 < tree.propose_seconds(decode) < target
