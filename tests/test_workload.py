"""Workloads: a bad jsonl line is that request's error only; arrivals are honoured; synthetic
lengths, Poisson arrivals and seeds."""

from __future__ import annotations

import json

import numpy as np
from hydra.utils import instantiate

from pipeline.config.compose import compose_config
from pipeline.schema import SyntheticWorkloadConf
from stages.loading.tokenizer import ByteTokenizer
from stages.workload import SyntheticWorkload, poisson_arrivals
from tests.helpers import make_config, schema_kwargs, serve


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


def test_jsonl_rows_after_a_blank_line_keep_their_own_ids(tmp_path):
    """One numbering, the file's: a row after a blank line is not taken for another's."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n\nnot json\n{"prompt": "b"}\n{"prompt": "c"}\n')
    from stages.workload.jsonl import JsonlWorkload

    requests = JsonlWorkload(str(path), 0, 4, 0.0, 0, 0, 0).load(ByteTokenizer(add_bos=False))
    assert [r.id for r in requests] == ["line-1", "line-3", "line-4", "line-5"]
    assert [r.error is None for r in requests] == [True, False, True, True]
    assert [r.prompt for r in requests] == ["a", "", "b", "c"]
    assert "line 3" in (requests[1].error or "")


def test_requests_wait_for_their_arrival(tmp_path):
    path = tmp_path / "timed.jsonl"
    rows = [
        {"id": f"t{i}", "prompt": "go", "max_new_tokens": 2, "arrival_s": 0.3 * i} for i in range(3)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    steps: list = []
    got, _ = serve(["workload=jsonl", f"workload.path={path}"], steps=steps)
    # An arrival waits at most for the step under way and its own first step; the bound is
    # the run's own slowest step, so a slow or loaded machine cannot fail it.
    slowest = max(step.duration_s for step in steps)
    for i in range(3):
        first_token = got[f"t{i}"].token_times[0]
        assert first_token >= 0.3 * i  # never served before it arrived
        assert first_token - got[f"t{i}"].arrival_s <= 2 * slowest + 0.25  # and soon after


def synthetic(**kwargs) -> list:
    return SyntheticWorkload(**schema_kwargs(SyntheticWorkloadConf, **kwargs)).load(
        ByteTokenizer(add_bos=True)
    )


def test_synthetic_lengths_are_drawn_from_their_ranges():
    requests = synthetic(
        num_requests=60, min_prompt_tokens=5, max_prompt_tokens=300, min_new_tokens=3,
        max_new_tokens=9, seed=1,
    )  # fmt: skip
    prompt_lens = [len(r.prompt_ids) for r in requests]
    new_tokens = [r.max_new_tokens for r in requests]
    assert min(prompt_lens) >= 5 and max(prompt_lens) <= 300
    assert min(new_tokens) >= 3 and max(new_tokens) <= 9
    # Uniform draws: 60 of them spread over the range, both ends of the new-token range hit.
    assert len(set(prompt_lens)) > 40 and min(prompt_lens) < 60 and max(prompt_lens) > 240
    assert set(new_tokens) == set(range(3, 10))
    # The byte tokenizer's prompts have exactly the drawn length: same seed, fixed prompt.
    exact = synthetic(num_requests=20, min_prompt_tokens=77, max_prompt_tokens=77, seed=2)
    assert {len(r.prompt_ids) for r in exact} == {77}
    assert all(r.prompt == ByteTokenizer(add_bos=True).decode(r.prompt_ids) for r in exact)


def test_poisson_gaps_have_mean_one_over_rate():
    rate, count = 8.0, 4000
    times = np.asarray(poisson_arrivals(count, rate, np.random.default_rng(0)))
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert (gaps > 0).all()
    # The mean of n exponential gaps has standard error (1/rate)/sqrt(n): allow four of them.
    assert abs(gaps.mean() - 1 / rate) < 4 * (1 / rate) / np.sqrt(count)
    # An exponential's standard deviation equals its mean (a Poisson process, not a grid).
    assert abs(gaps.std() / gaps.mean() - 1) < 0.1
    assert poisson_arrivals(3, 0.0, np.random.default_rng(0)) == [0.0, 0.0, 0.0]
    late = poisson_arrivals(5, 2.0, np.random.default_rng(0), start_s=1.5)
    assert min(late) > 1.5 and late == sorted(late)


def test_synthetic_workload_is_seeded():
    a = synthetic(num_requests=12, rate=5.0, seed=3, max_prompt_tokens=200)
    b = synthetic(num_requests=12, rate=5.0, seed=3, max_prompt_tokens=200)
    c = synthetic(num_requests=12, rate=5.0, seed=4, max_prompt_tokens=200)
    key = lambda rs: [(r.prompt, r.max_new_tokens, r.arrival_s) for r in rs]  # noqa: E731
    assert key(a) == key(b) and key(a) != key(c)
    times = [r.arrival_s for r in a]
    assert times == sorted(times) and times[0] > 0
    assert all(r.arrival_s == 0.0 for r in synthetic(num_requests=4, seed=3))


def test_mixed_workload_from_the_config():
    parts = "workload.parts"
    cfg = make_config(
        [
            "workload=mixed",
            f"{parts}.decode.num_requests=5",
            f"{parts}.long.num_requests=3",
            f"{parts}.long.min_prompt_tokens=150",
            f"{parts}.long.max_prompt_tokens=200",
        ]
    )
    requests = instantiate(cfg.workload).load(ByteTokenizer(add_bos=True))
    assert [r.id for r in requests] == [f"decode-{i}" for i in range(5)] + [
        f"long-{i}" for i in range(3)
    ]
    assert [r.index for r in requests] == list(range(8))
    decode, long = requests[:5], requests[5:]
    assert all(r.arrival_s == 0.0 and len(r.prompt_ids) <= 64 for r in decode)
    assert all(r.max_new_tokens >= 384 for r in decode)
    start = cfg.workload.parts.long.start_s
    assert all(r.arrival_s > start and 150 <= len(r.prompt_ids) <= 200 for r in long)


def test_long_prompts_preset_composes():
    cfg = compose_config(["+experiment=long_prompts"])
    assert cfg.workload._target_ == "stages.workload.MixedWorkload"
    longest = cfg.workload.parts.long.max_prompt_tokens + cfg.workload.parts.long.max_new_tokens
    everyone = cfg.workload.parts.decode.num_requests + cfg.workload.parts.long.num_requests
    assert longest <= 2048 and cfg.max_num_seqs >= everyone


def test_a_jsonl_line_longer_than_any_context_is_refused_unparsed(tmp_path, monkeypatch):
    """A line that cannot fit max_model_len is that row's error, and is never tokenized."""
    from stages.workload.jsonl import MAX_LINE_BYTES_PER_TOKEN, JsonlWorkload

    limit = 64 * MAX_LINE_BYTES_PER_TOKEN
    path = tmp_path / "big.jsonl"
    huge = json.dumps({"prompt": "x" * limit})
    fits = json.dumps({"prompt": "y" * (limit - 20)})  # the bound is on the line's bytes
    path.write_text(f'{{"prompt": "a"}}\n{huge}\n{fits}\n')
    tokenizer = ByteTokenizer(add_bos=False)
    seen: list[int] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: seen.append(len(text)) or encode(text))
    requests = JsonlWorkload(str(path), 0, 4, 0.0, 0, 0, max_model_len=64).load(tokenizer)
    assert [r.id for r in requests] == ["line-1", "line-2", "line-3"]
    assert requests[0].error is None and requests[2].error is None
    assert "max_model_len=64" in (requests[1].error or "")
    assert max(seen) < limit  # the long line never reached the tokenizer
