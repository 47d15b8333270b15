"""The router's policies (pipeline/disagg/routing.py) and a deployment served through them."""

from __future__ import annotations

import random

import pytest

from pipeline.config.checks import ConfigError
from pipeline.disagg.deployment import build_deployment, simulate
from pipeline.disagg.latency import ttft_parts_s
from pipeline.disagg.routing import ConsistentHash, RoundRobin, make_router, shares
from pipeline.executors import check_config
from stages.scheduling.request import Request
from tests.helpers import make_config
from tests.test_disagg import CLOSED, SMALL, most_in_flight


def prompts(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(id=str(i), index=i, prompt="", max_new_tokens=1,
                prompt_ids=[rng.randrange(32000) for _ in range(rng.randrange(1, 40))])
        for i in range(n)
    ]  # fmt: skip


def test_round_robin_takes_the_instances_in_turn():
    router = RoundRobin(3)
    assert [router.pick(r) for r in prompts(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_prompt_always_goes_to_the_same_instance_and_prompts_spread_over_all():
    router = ConsistentHash(8, "prefill")
    requests = prompts(4000)
    again = [Request(id="x", index=0, prompt="", prompt_ids=list(r.prompt_ids),
                     max_new_tokens=1) for r in requests]  # fmt: skip
    assert [router.pick(r) for r in requests] == [router.pick(r) for r in again]
    counts = [len(share) for share in shares(router, requests, 8)]
    # 160 virtual nodes an instance keep each share near an eighth
    assert all(0.6 * 500 < c < 1.4 * 500 for c in counts), counts


def test_a_new_instance_takes_keys_only_for_itself():
    """Consistent hashing's property: growing the ring moves a key only to the new node."""
    requests = prompts(2000, seed=1)
    before = [ConsistentHash(5, "decode").pick(r) for r in requests]
    after = [ConsistentHash(6, "decode").pick(r) for r in requests]
    moved = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert moved and all(b == 5 for _, b in moved)
    assert 0.05 < len(moved) / len(requests) < 0.35  # about a sixth


def test_each_pool_has_its_own_ring():
    requests = prompts(500, seed=2)
    prefill, decode = (
        make_router("consistent_hash", 4, "prefill"),
        make_router("consistent_hash", 4, "decode"),
    )
    assert [prefill.pick(r) for r in requests] != [decode.pick(r) for r in requests]


def test_an_unknown_policy_is_a_one_line_error_naming_the_choices():
    with pytest.raises(
        ConfigError, match="disagg.router='least_tokens': give one of round_robin, "
    ):
        check_config(make_config([*SMALL, "disagg.prefill=1", "disagg.decode=1",
                                  "disagg.router=least_tokens"]))  # fmt: skip


def served_alike(overrides: list[str]) -> list[list[float]]:
    """Each request's token times when every request has the same prompt."""
    deployment = build_deployment(make_config(overrides))
    same = list(deployment.requests[0].prompt_ids)
    for r in deployment.requests:
        r.prompt_ids = list(same)
    simulate(deployment)
    return [r.token_times for r in deployment.requests]


@pytest.mark.parametrize("load", [[], ["workload.concurrency=5"]])
def test_one_prompt_hashed_over_many_instances_is_served_as_by_one_of_each(load):
    """The oracle: a prompt's key picks one instance of each pool, so a deployment of three
    and two serves a workload of one prompt as a deployment of one and one."""
    many = [*CLOSED, *load, "disagg.prefill=3", "disagg.decode=2",
            "disagg.router=consistent_hash"]  # fmt: skip
    one = [*CLOSED, *load, "disagg.prefill=1", "disagg.decode=1"]
    assert served_alike(many) == [pytest.approx(t) for t in served_alike(one)]


def test_a_hashed_closed_loop_serves_every_request_within_its_concurrency():
    deployment = build_deployment(
        make_config(
            [*CLOSED, "workload.concurrency=6", "disagg.prefill=3", "disagg.router=consistent_hash"]
        )  # fmt: skip
    )
    simulate(deployment)
    requests = deployment.requests
    assert all(len(r.output_ids) == r.max_new_tokens for r in requests)
    assert most_in_flight(requests) == 6


def test_two_draws_keep_the_instances_even_and_one_draw_does_not():
    """The power of two choices: the lighter of two draws keeps a burst's shares within a
    request or two of each other; one draw alone spreads them."""
    requests = prompts(800, seed=3)
    two, one = make_router("power_of_two", 8, "prefill"), make_router("random", 8, "prefill")
    evened = [len(share) for share in shares(two, requests, 8)]
    spread = [len(share) for share in shares(one, requests, 8)]
    assert max(evened) - min(evened) <= 2, evened
    assert max(spread) - min(spread) > 10, spread
    # an answered request no longer weighs on its instance: once the last instance's are
    # all answered, it wins every draw it is in until it catches up
    for _ in range(evened[7]):
        two.finished(7)
    counts = [len(share) for share in shares(two, prompts(60, seed=4), 8)]
    assert all(counts[7] > c for c in counts[:7]), counts


def test_an_open_loop_served_side_by_side_is_the_open_loop():
    """A policy that follows the load serves an open loop side by side (no concurrency
    limit); in turn, that gives the pool-after-pool open loop's token times."""
    from pipeline.disagg.closed_loop import ClosedLoop, Copies
    from pipeline.disagg.deployment import decode_copy, finish, prefill_copy

    overrides = [*CLOSED, "disagg.prefill=2"]
    pooled = build_deployment(make_config(overrides))
    simulate(pooled)
    side = build_deployment(make_config(overrides))
    copies = Copies(lambda r: prefill_copy(side, r), lambda r, f: decode_copy(side, r, f))
    loop = ClosedLoop((side.prefill, side.decode), side.requests, 0, copies, side.totals,
                      side.pulls, side.routers)  # fmt: skip
    firsts, rests, _ = loop.serve()
    finish(side, firsts, rests)
    for a, b in zip(pooled.requests, side.requests, strict=True):
        assert b.token_times == pytest.approx(a.token_times)


@pytest.mark.parametrize("policy", ["power_of_two", "cache_aware"])
@pytest.mark.parametrize("load", [[], ["workload.concurrency=6"]])
def test_a_deployment_behind_a_router_that_follows_the_load_serves_every_request(load, policy):
    deployment = build_deployment(
        make_config([*CLOSED, *load, "disagg.prefill=3", f"disagg.router={policy}"])
    )
    simulate(deployment)
    requests = deployment.requests
    assert all(len(r.output_ids) == r.max_new_tokens for r in requests)
    if load:
        assert most_in_flight(requests) == 6
    parts = ttft_parts_s(deployment.served, deployment.hops_s)
    for i, r in enumerate(requests):
        assert sum(p[i] for p in parts.values()) == pytest.approx(r.token_times[0] - r.arrival_s)


def request_of(ids: list[int]) -> Request:
    return Request(id="r", index=0, prompt="", prompt_ids=ids, max_new_tokens=1)


def test_cache_aware_keeps_a_shared_prefix_together_and_spreads_the_rest():
    rng = random.Random(5)
    systems = [[rng.randrange(32000) for _ in range(256)] for _ in range(4)]
    router = make_router("cache_aware", 4, "prefill")
    picks: dict[int, set[int]] = {k: set() for k in range(4)}
    for _ in range(10):
        for k, system in enumerate(systems):  # a system prompt and a user turn of its own
            turn = [rng.randrange(32000) for _ in range(64)]
            picks[k].add(router.pick(request_of(system + turn)))
    # each system prompt's turns share its instance (256 of 320 tokens match), and the
    # four, matching nothing at first, went to the smallest trees: one instance each
    assert all(len(p) == 1 for p in picks.values()), picks
    assert len(set().union(*picks.values())) == 4


def test_cache_aware_sends_to_the_idlest_once_the_load_is_uneven():
    router = make_router("cache_aware", 2, "prefill")
    prompt = list(range(320))
    first = router.pick(request_of(prompt))
    for _ in range(64):  # the same prompt: a full match keeps it on its instance
        assert router.pick(request_of(prompt)) == first
    # 65 in flight against none: past 64 more and 1.5 times as many, the idlest takes it
    assert router.pick(request_of(prompt)) == 1 - first
    for _ in range(65):
        router.finished(first)
    assert router.pick(request_of(prompt)) == first  # even again: the match decides
