"""Requests a server must answer with a clear 4xx in OpenAI's shape (never a 500, a dropped
connection or a false record): log-probabilities of a model that computes none, prompts of
token ids, echoed values without bound, a foreign Host, raw protocol errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_serve import AUTH, SERVER, running_server

SIMULATED = ["executor=simulated", "hardware=gaudi3", "model=spec/ernie45_0p3b",
             "max_num_seqs=4", "max_model_len=256"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("tiny")
    with running_server(SERVER, out) as (url, _):
        yield url, out


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("simulated")
    with running_server(SIMULATED, out) as (url, _):
        yield url, out


def post(url: str, body: object, route: str = "completions", **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/{route}", json=body, headers={**AUTH, **headers}, timeout=60)


def error_of(response: httpx.Response) -> dict:
    error = response.json()["error"]
    assert "\n" not in error["message"]
    return error


def generation_lines(out: Path) -> list[dict]:
    path = out / "generations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------- case 3: a model without logits


@pytest.mark.parametrize(
    "route, body",
    [
        ("completions", {"prompt": "hi", "max_tokens": 3, "logprobs": 5}),
        ("completions", {"prompt": "hi", "max_tokens": 3, "logprobs": 0, "stream": True}),
        ("completions", {"prompt": "hi", "max_tokens": 3, "logprobs": 1, "echo": True}),
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                              "logprobs": True, "top_logprobs": 2, "stream": True}),
    ],
)  # fmt: skip
def test_a_simulated_model_refuses_logprobs_and_records_nothing(simulated, route, body):
    url, out = simulated
    before = generation_lines(out)
    response = post(url, body, route)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == "logprobs" and "simulated" in error["message"]
    assert generation_lines(out) == before  # a refused request is no finished one
    plain = post(url, {"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 3


# ------------------------------------------------------ case 8: token-id prompts


@pytest.mark.parametrize("prompt, tokens", [([256], 1), ([257, 258], 2), ([[256]], 1)])
def test_a_prompt_of_special_token_ids_is_served(tiny, prompt, tokens):
    """The byte tokenizer's ids 256..258 are its special tokens (they decode to no text):
    a prompt of them still has tokens, and is served."""
    response = post(tiny[0], {"prompt": prompt, "max_tokens": 2, "ignore_eos": True})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (tokens, 2)


@pytest.mark.parametrize("prompt", ["", []])
def test_a_prompt_without_tokens_is_still_refused(tiny, prompt):
    response = post(tiny[0], {"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400 and error_of(response)["param"] == "prompt"
