"""The speed rule of a bucket plan: a recommended set is never slower than the reference
built-in set and has no more graphs; otherwise the built-in itself is recommended."""

from __future__ import annotations

from pathlib import Path

from pipeline.buckets.serving import Served
from pipeline.buckets.speed import choose, not_slower


def served(label: str, graphs: int, seconds: float, ttft: float, tpot: float) -> Served:
    return Served(label, [], Path("."), 0, 0, 0.9, graphs, duration_s=seconds,
                  ttft_ms=(ttft / 2, ttft), tpot_ms=(tpot, tpot))  # fmt: skip


EXP = served("exponential", 151, 380.0, 1500.0, 30.0)
LIN = served("linear", 3848, 381.0, 960.0, 28.8)


def test_a_faster_plan_with_no_more_graphs_is_recommended():
    fast = served("b0.01r64", 151, 380.5, 1174.0, 29.6)  # 0.13% longer: within 1%
    choice = choose([fast], [LIN, EXP], budget=151)
    assert choice.planned and choice.chosen is fast and choice.reference is EXP


def test_a_plan_slower_than_the_reference_falls_back_to_it():
    # the numbers: a 64-graph plan at 4.0 s TTFT p50 against exponential's 3.4 s
    slow = served("b0.001", 64, 400.0, 8000.0, 49.7)
    choice = choose([slow], [LIN, EXP], budget=64)
    assert not choice.planned and choice.chosen is EXP
    assert "fewest graphs (none fits 64)" in choice.reason


def test_more_graphs_than_the_reference_is_not_allowed():
    rich = served("b0.1", 200, 300.0, 500.0, 20.0)  # faster, but 200 > 151 graphs
    assert not choose([rich], [LIN, EXP], budget=151).planned


def test_the_reference_is_the_fastest_built_in_within_the_budget():
    # with room for linear: serve times tie within 1% (381 vs 380 s), so the lower TTFT
    # p90 (960 against 1500 ms) makes linear the faster
    choice = choose([], [LIN, EXP], budget=5000)
    assert choice.chosen is LIN and "within 5000 graphs" in choice.reason
    assert not_slower(LIN, EXP) and not not_slower(EXP, LIN)


def test_max_shapes_takes_a_count_or_the_exponential_sets():
    from pipeline.buckets import EXPONENTIAL_BUDGET, _budget, main

    assert _budget("exponential") == EXPONENTIAL_BUDGET and _budget("64") == 64
    assert main(["plan", "--workload", "x=1", "--max-shapes", "0", "--out", "/tmp/x"]) == 2
