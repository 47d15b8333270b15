"""The acceptance tool (benchmarks.spec_acceptance): prompt lookup and recorded spans walked
by hand, and the identity that makes its output what speculative.acceptance means: the
per-position acceptance it prints gives back, through E, the tokens a step it counted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.spec_acceptance import (
    Tally,
    lookup,
    main,
    measure,
    ngram_steps,
    recorded_lookup_steps,
    recorded_steps,
)
from stages.simulator.speculative import expected_tokens


def test_prompt_lookup_by_hand():
    # The context ends in 7, which occurred first at 0: its followers 1, 2, 3 are proposed
    # and all match; then [2, 3, 4] recurs and proposes 7, which the output's 8 rejects.
    prompt, output = [7, 1, 2, 3, 4, 7], [1, 2, 3, 4, 8]
    assert lookup(prompt, 3, 1, 3) == [1, 2, 3]
    assert ngram_steps(prompt, output, 3) == [(3, True), (0, True)]
    tally = Tally(3)
    for m in (3, 0):
        tally.add(m)
    assert tally.acceptance() == [0.5, 1.0, 1.0]
    assert tally.tokens_per_step() == 2.5 == expected_tokens(tally.acceptance(), 3)


def test_no_match_proposes_nothing_and_leaves_the_acceptance_to_the_steps_that_do():
    assert lookup([1, 2, 3], 3, 1, 3) == []
    assert ngram_steps([1, 2, 3], [4, 5], 2) == [(0, False), (0, False)]
    tally = Tally(2)
    for m, proposed in ((2, True), (0, False), (0, False), (0, True)):
        tally.add(m, proposed)
    # 2 of 4 steps propose; of those, position 1 is accepted once in 2, position 2 once in 1
    assert (tally.proposal_rate(), tally.acceptance()) == (0.5, [0.5, 1.0])
    assert tally.tokens_per_step() == 6 / 4 == expected_tokens([0.5, 1.0], 2, 0.5)


def test_recorded_spans_propose_where_the_lookup_finds_a_3_gram():
    # The context [5, 6, 7, 9, 5, 6, 7] ends in a 3-gram seen before (proposing 9); after
    # the step's accepted 9 and its own 1, [7, 9, 1] has not been seen: no proposal.
    prompt, output = [5, 6, 7, 9, 5, 6, 7], [9, 1, 2]
    assert recorded_lookup_steps(prompt, output, [2, 1, 1], 3, (3, 3)) == [(1, True), (0, False)]


def test_recorded_spans_by_hand():
    # Spans include the step's own token: 3 -> 2 accepted, 5 -> 3 (k caps it), 1 -> none.
    assert recorded_steps([3, 1, 1, 5, 1, 1, 1, 1], 3) == [2, 3, 0]


@given(
    st.integers(1, 6),
    st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=200),
)
def test_the_printed_acceptance_and_rate_give_back_the_tokens_a_step(k, steps):
    tally = Tally(k)
    for m, proposed in steps:
        tally.add(min(m, k) if proposed else 0, proposed)
    rate = tally.proposal_rate()
    expected = expected_tokens(tally.acceptance(), k, rate) if rate else 1.0
    assert expected == pytest.approx(tally.tokens_per_step())


TRACES = Path(os.environ.get("SPEC_TRACES", "/nonexistent"))


@pytest.mark.skipif(
    not (TRACES / "combined_gsm8k.jsonl").is_file(),
    reason="set SPEC_TRACES to data/llama3.1-8B of github.com/SpecDecode-Bench/simulator",
)
def test_real_generations_of_llama_31_8b(capsys):
    import json

    with open(TRACES / "combined_gsm8k.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f][:40]
    for method, key in (("ngram", ""), ("recorded", "acc_eagle")):
        tally = measure(rows, 3, method, key)
        assert 1.0 < tally.tokens_per_step() < 4.0
        assert all(0.0 <= a <= 1.0 for a in tally.acceptance())
    assert main([str(TRACES / "combined_gsm8k.jsonl"), "--limit", "5"]) == 0
    assert "speculative.acceptance=[" in capsys.readouterr().out


def test_a_run_folders_generations_are_measured_with_their_own_prompt_ids(tmp_path):
    """A run of this engine measured as it served: each row's prompt ids are the ones its
    workload made (as many as generations.jsonl's prompt_tokens says), and every output
    token is counted once."""
    from benchmarks.spec_acceptance import run_rows
    from pipeline.job.run import run
    from pipeline.run_folder.artefacts import read_generations
    from tests.helpers import make_config

    run(make_config(["workload.num_requests=3"]), tmp_path)
    lines = read_generations(tmp_path / "generations.jsonl")
    rows = run_rows(tmp_path)
    by_length = sorted(len(r["prompt_token_ids"]) for r in rows)
    assert by_length == sorted(line["prompt_tokens"] for line in lines)
    tally = measure(rows, 2, "ngram", "")
    assert tally.generated == sum(len(line["output_ids"]) for line in lines)
    assert main([str(tmp_path / "nowhere")]) == 2
