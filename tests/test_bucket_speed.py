"""The speed rule of a bucket plan: a recommended set is never slower than the reference
built-in set and has no more graphs; otherwise the built-in itself is recommended."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_the_budget_is_a_hard_limit():
    # the numbers: a 64-graph plan, exponential 151 graphs: with --max-shapes 64 no
    # built-in fits, and the planned set within it is recommended, never exponential
    slow = served("b0.001", 64, 400.0, 8000.0, 49.7)
    choice = choose([slow], [LIN, EXP], budget=64)
    assert choice.chosen is slow and choice.chosen.warmup_shapes <= 64
    assert "no built-in fits 64 graphs" in choice.reason
    # what the budget costs against the fastest set beyond it: linear (381 s ties
    # exponential's 380 s within 1%, and its TTFT p90 is lower): 400 / 381 - 1 = 5.0%
    assert "costs 5.0% serving time against the fastest set beyond it, linear" in choice.reason
    with pytest.raises(ValueError, match="no bucket set fits --max-shapes 64"):
        choose([], [LIN, EXP], budget=64)


def test_a_plan_slower_than_the_reference_falls_back_to_it():
    slow = served("b0.001", 151, 400.0, 8000.0, 49.7)
    choice = choose([slow], [LIN, EXP], budget=151)
    assert not choice.planned and choice.chosen is EXP


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


def test_the_report_counts_the_graphs_the_run_counted(tmp_path):
    # no prefix caching and more rows x full rows (128 x 64 blocks) than the pool: the
    # decode blocks axis ends at the pool, which a folder without pipeline.log must give
    import json

    from pipeline.buckets import run_limits, simulated_run
    from pipeline.run_folder.reader import read_step_lines
    from stages.forward.bucket_planner import Workload, evaluate
    from stages.forward.buckets import Bucketing

    run = simulated_run(["hardware=gaudi2", "model=spec/ernie45_21b_a3b", "max_num_seqs=128",
                         "max_model_len=8192", "prefix_caching=false",
                         "workload.num_requests=4"], tmp_path / "run")  # fmt: skip
    assert not (run / "pipeline.log").exists()
    limits = run_limits(run)
    workload = Workload.of(read_step_lines(run / "steps.jsonl"))
    linear = evaluate(workload, limits.buckets(Bucketing.linear), limits.rule)
    assert linear.num_shapes == json.loads((run / "metrics.json").read_text())["warmup_shapes"]
