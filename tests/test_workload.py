"""Workloads: a bad jsonl line is that request's error only; arrivals are honoured."""

from __future__ import annotations

import json

from tests.conftest import serve


def test_jsonl_bad_lines_fail_alone(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [
        json.dumps({"id": "a", "prompt": "hello there", "max_new_tokens": 5}),
        "{not json",
        json.dumps({"prompt": ""}),
        json.dumps({"id": "b", "prompt": "x" * 300}),  # longer than max_model_len=256
        json.dumps({"id": "c", "prompt": "stop here", "max_new_tokens": 0}),
        json.dumps({"id": "d", "prompt": "more", "colour": "red"}),
        json.dumps({"id": "e", "prompt": "the end", "max_new_tokens": 3, "ignore_eos": True}),
    ]
    path.write_text("\n".join(lines) + "\n")
    got, _ = serve(["workload=jsonl", f"workload.path={path}"])
    errors = {rid: r.error for rid, r in got.items()}
    assert errors["a"] is None and len(got["a"].output_ids) <= 5
    assert got["e"].output_ids and len(got["e"].output_ids) == 3
    assert "line 2" in errors["line-2"]
    assert errors["line-3"] == "empty prompt"
    assert "max_model_len=256" in errors["b"]
    assert "max_new_tokens=0" in errors["c"]
    assert "colour" in errors["d"]
    assert all(r.finished for r in got.values())
    assert {r.finish_reason for rid, r in got.items() if errors[rid]} == {"error"}


def test_requests_wait_for_their_arrival(tmp_path):
    path = tmp_path / "timed.jsonl"
    rows = [
        {"id": f"t{i}", "prompt": "go", "max_new_tokens": 2, "arrival_s": 0.3 * i} for i in range(3)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    got, _ = serve(["workload=jsonl", f"workload.path={path}"])
    for i in range(3):
        first_token = got[f"t{i}"].token_times[0]
        assert first_token >= 0.3 * i  # never served before it arrived
        assert got[f"t{i}"].token_times[0] - got[f"t{i}"].arrival_s < 0.25  # and soon after


def test_synthetic_poisson_arrivals_are_seeded_and_increasing():
    from stages.tokenizer import ByteTokenizer
    from stages.workload import SyntheticWorkload

    make = lambda: SyntheticWorkload(num_requests=20, rate=5.0, seed=3).load(ByteTokenizer())  # noqa: E731
    a, b = make(), make()
    times = [r.arrival_s for r in a]
    assert times == [r.arrival_s for r in b] and times == sorted(times) and times[0] > 0
    assert [r.prompt for r in a] == [r.prompt for r in b]
    # Mean gap of a rate-5 process is 0.2 s; 20 draws land well within a factor of two.
    assert 0.1 < times[-1] / 20 < 0.4
