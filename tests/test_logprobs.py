"""Log-probabilities against the oracle: an independent float64 log-softmax of the dense
reference's logits (attention=reference, whole prompts), each prompt position's logits
taken from the reference run of the prompt cut after that position."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import pytest

from pipeline.executors import build_engine
from stages.sampling.logprobs import asked_counts
from stages.scheduling.request import Request, SamplingParams
from tests.helpers import RecordingSampler, make_config

PROMPT = "Chunked prefill " * 9
CHUNK = 32  # the step budget: the prompt's prefill takes several steps
ENGINE = ["model=tiny", f"max_tokens={CHUNK}"]
ORACLE = ["model=tiny", "attention=reference", "scheduler=whole", "max_tokens=4096"]
TOLERANCE = 1e-4


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    peak = x.max()
    return x - (peak + math.log(float(np.exp(x - peak).sum())))


def reference_logprobs(ids: Sequence[int], outputs: int) -> list[np.ndarray]:
    """The oracle's log-probabilities at positions 0..len(ids)-2 (each scores the next prompt
    token), then at each of `outputs` generated tokens' steps."""
    engine, _ = build_engine(make_config(ORACLE))
    recorder = RecordingSampler(engine.sampler)
    engine.sampler = recorder
    cut = [Request(f"p{i}", i, "x", list(ids[: i + 1]), 1) for i in range(len(ids) - 1)]
    whole = Request("whole", len(ids), "x", list(ids), outputs)
    engine.run([*cut, whole])
    prompt = [log_softmax(recorder.logits[(r.id, 0)]) for r in cut]
    return prompt + [log_softmax(recorder.logits[("whole", i)]) for i in range(outputs)]


def check_entry(entry: dict[int, float], expected: np.ndarray, token: int, k: int) -> None:
    """The scored token's value, and the k most likely tokens in order, as the oracle's."""
    assert abs(entry[token] - expected[token]) < TOLERANCE
    top = np.argsort(-expected, kind="stable")[:k].tolist()
    assert list(entry)[:k] == top
    for t in top:
        assert abs(entry[t] - expected[t]) < TOLERANCE
    assert set(entry) == {*top, token}


@pytest.fixture(scope="module", params=["packed", "padded"])
def chunked_run(request):
    """The prompt's rows packed (the CPU attention's layout) or padded to the prefill
    bucket (the reference attention's, as the HPU's), chunked either way."""
    padded = ["attention=reference"] if request.param == "padded" else []
    engine, _ = build_engine(make_config([*ENGINE, *padded]))
    assert engine.attention.packs_rows == (request.param == "packed")
    ids = engine.tokenizer.encode(PROMPT)
    asked = SamplingParams(logprobs=2, prompt_logprobs=3)
    asking = Request("a", 0, PROMPT, ids, 4, sampling=asked)
    plain = Request("b", 1, PROMPT, ids, 4)
    steps: list = []
    engine.run([asking, plain], on_step=steps.append)
    return asking, plain, steps, oracle(tuple(ids))


@functools.lru_cache(maxsize=2)
def oracle(ids: tuple[int, ...]) -> list[np.ndarray]:
    return reference_logprobs(ids, 4)


def test_prompt_logprobs_under_chunked_prefill_equal_the_oracle(chunked_run):
    request, _, steps, expected = chunked_run
    ids = list(request.prompt_ids)
    assert len(ids) > 3 * CHUNK  # the prompt's prefill is split over several chunks
    assert len(steps) >= len(ids) // CHUNK + len(request.output_ids) - 1
    assert request.prompt_logprobs is not None and len(request.prompt_logprobs) == len(ids) - 1
    for i, entry in enumerate(request.prompt_logprobs):
        check_entry(entry, expected[i], ids[i + 1], 3)


def test_output_logprobs_equal_the_oracle_and_cost_nothing_unasked(chunked_run):
    request, plain, _, expected = chunked_run
    prompt_rows = len(request.prompt_ids) - 1
    assert len(request.logprobs) == len(request.output_ids) == 4
    for i, (token, entry) in enumerate(zip(request.output_ids, request.logprobs, strict=True)):
        check_entry(entry, expected[prompt_rows + i], token, 2)
    # The request beside it asked for none: nothing kept, the same tokens.
    assert plain.logprobs == [] and plain.prompt_logprobs is None
    assert plain.output_ids == request.output_ids


def test_no_request_asking_means_no_logprob_work():
    rows = [Request(str(i), i, "x", [1, 2], 1) for i in range(3)]
    assert asked_counts(rows, 0) is None
    rows[1].sampling = SamplingParams(logprobs=0)
    assert asked_counts(rows, 0) == [None, 0, None]
    assert asked_counts(rows, 5) == [5, 0, 5]


def test_prompt_logprobs_bypass_the_prefix_cache():
    """A cached prefix has no logits: a request asking for prompt log-probabilities
    computes its whole prompt (as vLLM), and gets the same values as the first."""
    engine, _ = build_engine(make_config([*ENGINE, "prefix_caching=true"]))
    ids = engine.tokenizer.encode(PROMPT)
    first = Request("a", 0, PROMPT, ids, 1)
    engine.run([first])
    asked = [Request(f"b{i}", i, PROMPT, ids, 1) for i in range(2)]
    for r in asked:
        r.sampling = SamplingParams(prompt_logprobs=1)
    plain = Request("c", 2, PROMPT, ids, 1)
    engine.run([*asked, plain])
    assert plain.cached_tokens > 0  # the prefix is cached: those asking skipped it
    assert [r.cached_tokens for r in asked] == [0, 0]
    a, b = (r.prompt_logprobs for r in asked)
    assert a is not None and b is not None and len(a) == len(ids) - 1
    assert all(abs(x[t] - y[t]) < TOLERANCE for x, y, t in zip(a, b, ids[1:], strict=True))
