"""Logprobs and echo through the HTTP server, in OpenAI's shapes, against the oracle: an
independent log-softmax of the dense reference's logits (tests/test_logprobs.py). The
server chunks prefill (max_tokens=64), so the echoed prompt is scored over several chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from pipeline.serve.worker import EngineWorker
from tests.test_logprobs import PROMPT, TOLERANCE, reference_logprobs
from tests.test_serve import AUTH, SERVER, running_server

OUTPUTS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, EngineWorker]]:
    with running_server(SERVER, tmp_path_factory.mktemp("serve")) as running:
        yield running


@pytest.fixture(scope="module")
def prompt_ids(server) -> list[int]:
    return server[1].engine.tokenizer.encode(PROMPT)


@pytest.fixture(scope="module")
def oracle(prompt_ids) -> list[np.ndarray]:
    return reference_logprobs(prompt_ids, OUTPUTS)


def post(url: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{route}", json=body, headers=AUTH, timeout=120)


def close(got: float, expected: float) -> bool:
    return abs(got - expected) < TOLERANCE


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_echo_scores_the_prompt_as_lm_eval_asks(server, prompt_ids, oracle, max_tokens):
    """lm-eval's loglikelihood request: token ids in a list of one, echo, logprobs=1."""
    body = {"prompt": [prompt_ids], "echo": True, "logprobs": 1, "max_tokens": max_tokens,
            "temperature": 0, "seed": 1234}  # fmt: skip
    reply = post(server[0], "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(prompt_ids) + max_tokens
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for i, token in enumerate(prompt_ids[1:]):
        expected = oracle[i]
        assert close(lp["token_logprobs"][i + 1], expected[token])
        # the most likely token's value, and the scored one's
        assert close(max(lp["top_logprobs"][i + 1].values()), expected.max())
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert choice["text"].startswith(PROMPT)
    assert reply.json()["usage"]["completion_tokens"] == max_tokens
    if max_tokens == 0:
        assert choice["text"] == PROMPT


def test_output_logprobs_equal_the_oracle(server, prompt_ids, oracle):
    body = {"prompt": PROMPT, "logprobs": 3, "max_tokens": OUTPUTS, "ignore_eos": True}
    lp = post(server[0], "/v1/completions", body).json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == OUTPUTS
    tokenizer = server[1].engine.tokenizer
    for i, (piece, value, top) in enumerate(
        zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True)
    ):
        expected = oracle[len(prompt_ids) - 1 + i]
        token = int(np.argmax(expected))  # greedy: the most likely token was sampled
        assert piece == tokenizer.decode([token])
        assert close(value, expected[token])
        # text -> value of the 3 most likely (texts may coincide: a cut UTF-8 character)
        best = {tokenizer.decode([int(t)]): expected[t] for t in np.argsort(-expected)[:3]}
        assert top.keys() == best.keys()
        assert all(close(top[text], best[text]) for text in best)


def test_chat_logprobs_in_the_chat_shape(server):
    tokenizer = server[1].engine.tokenizer
    messages = [{"role": "user", "content": "Name a colour"}]
    _, ids = tokenizer.encode_chat(messages)
    oracle = reference_logprobs(ids, 3)
    body = {"messages": messages, "logprobs": True, "top_logprobs": 2, "max_tokens": 3,
            "ignore_eos": True}  # fmt: skip
    content = post(server[0], "/v1/chat/completions", body).json()["choices"][0]["logprobs"]
    items = content["content"]
    assert len(items) == 3
    for i, item in enumerate(items):
        expected = oracle[len(ids) - 1 + i]
        assert close(item["logprob"], expected.max())
        assert item["bytes"] == list(item["token"].encode())
        assert len(item["top_logprobs"]) == 2
        second = np.sort(expected)[-2]
        assert close(item["top_logprobs"][1]["logprob"], second)


def test_streamed_chunks_carry_their_tokens_logprobs(server):
    body = {"prompt": PROMPT, "logprobs": 2, "max_tokens": OUTPUTS, "ignore_eos": True}
    whole = post(server[0], "/v1/completions", body).json()["choices"][0]["logprobs"]
    streamed: list[float] = []
    with httpx.stream("POST", f"{server[0]}/v1/completions", json={**body, "stream": True},
                      headers=AUTH, timeout=120) as reply:  # fmt: skip
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                logprobs = json.loads(line[6:])["choices"][0]["logprobs"]
                if logprobs:
                    streamed += logprobs["token_logprobs"]
    assert streamed == whole["token_logprobs"]


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "echo": True, "stream": True}, "echo"),
        ("/v1/completions", {"prompt": [[1], [2]]}, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),  # fmt: skip
    ],
)
def test_impossible_logprob_requests_are_400(server, route, body, param):
    reply = post(server[0], route, body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


def test_streamed_chat_chunks_carry_content_items(server):
    messages = [{"role": "user", "content": "Name a colour"}]
    body = {"messages": messages, "logprobs": True, "top_logprobs": 1, "max_tokens": 3,
            "ignore_eos": True}  # fmt: skip
    whole = post(server[0], "/v1/chat/completions", body).json()["choices"][0]["logprobs"]
    items: list[dict] = []
    url, streamed = f"{server[0]}/v1/chat/completions", {**body, "stream": True}
    with httpx.stream("POST", url, json=streamed, headers=AUTH, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                logprobs = json.loads(line[6:])["choices"][0]["logprobs"]
                if logprobs:
                    items += logprobs["content"]
    assert items == whole["content"] and len(items) == 3
