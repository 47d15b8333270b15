"""Requests a server must answer with a clear 4xx in OpenAI's shape (never a 500, a dropped
connection or a false record): log-probabilities of a model that computes none, prompts of
token ids, echoed values without bound, a foreign Host, raw protocol errors."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.serve.guards import answered_hosts, host_name
from pipeline.serve.worker import EngineWorker
from tests.helpers_serve import live_server
from tests.test_serve import AUTH, SERVER, running_server

SIMULATED = ["executor=simulated", "hardware=gaudi3", "model=spec/ernie45_0p3b",
             "max_num_seqs=4", "max_model_len=256"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Iterator[tuple[str, Path, EngineWorker]]:
    """The tiny model's server with the server's own connection handling (uvicorn_config)."""
    out = tmp_path_factory.mktemp("tiny")
    with live_server(SERVER, out) as served:
        yield served.url, out, served.worker


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


# ------------------------------------------------------ case 9: echoed values


def test_echoed_values_are_cut_short(tiny):
    url = tiny[0]
    bias = {str(i): 1.0 for i in range(20_000)}
    response = post(url, {"prompt": "hi", "logit_bias": bias})
    assert response.status_code == 400 and error_of(response)["param"] == "logit_bias"
    assert len(response.content) < 2000 and "characters)" in error_of(response)["message"]
    path = "/v1/" + "p" * 60_000  # httpx sends URLs up to 64 KiB
    response = httpx.get(f"{url}{path}", headers=AUTH, timeout=30)
    assert response.status_code == 404 and len(response.content) < 2000
    assert error_of(response)["message"].startswith("GET /v1/ppp")
    response = post(url, {"prompt": "hi", "model": "m" * 100_000})
    assert response.status_code == 404 and len(response.content) < 2000


# ------------------------------------------------------- case 14: DNS rebinding


def test_a_foreign_host_is_refused_where_the_server_listens_on_loopback(tiny):
    url = tiny[0]
    port = url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        response = httpx.get(f"{url}/health", headers={"Host": host}, timeout=10)
        assert response.status_code == 400 and error_of(response)["param"] == "host", host
        refused = post(url, {"prompt": "hi", "max_tokens": 1}, Host=host)
        assert refused.status_code == 400 and error_of(refused)["param"] == "host"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
        assert httpx.get(f"{url}/health", headers={"Host": host}, timeout=10).status_code == 200


def test_the_names_answered_follow_the_address_and_the_setting():
    assert answered_hosts("127.0.0.1", []) == {"localhost", "127.0.0.1", "[::1]"}
    assert answered_hosts("0.0.0.0", []) is None  # every interface: names unknown, any
    assert answered_hosts("127.0.0.1", ["*"]) is None
    assert answered_hosts("0.0.0.0", ["API.example.com"]) == {"api.example.com"}
    assert [host_name(h) for h in ("[::1]:80", "a.b:1", "a.b", "::1")] == [
        "[::1]", "a.b", "a.b", "::1"]  # fmt: skip


# ------------------------------------------------------ case 15: raw HTTP errors


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 2\r\nContent-Length: 3\r\n",
        b"Content-Length: -1\r\n",
        # h11 reads the chunks (RFC 9112: Transfer-Encoding overrides Content-Length): the
        # body reaches the route, which refuses it
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        # a head still unfinished beyond h11's 16 KiB (a longer one sent on would meet a
        # closed connection: the kernel's reset may lose the answer in flight)
        b"X-Big: " + b"a" * 20_000,
    ],
    ids=["two-lengths", "negative-length", "length-and-chunked", "big-header"],
)
def test_a_request_http_cannot_parse_gets_openais_error_shape(tiny, head):
    url = tiny[0]
    host, port = url.removeprefix("http://").split(":")
    auth = (f"Authorization: {AUTH['Authorization']}\r\nContent-Type: application/json\r\n"
            "Connection: close\r\n")  # fmt: skip
    body = b"" if b"chunked" in head or b"X-Big" in head else b"\r\n{}"
    request = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n" + auth.encode() + head + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(request)
        except OSError:  # the server may answer and close before the last bytes arrive
            pass
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    headers, _, answer_body = rest.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"content-type: application/json" in headers.lower()
    error = json.loads(answer_body)["error"]  # h11's refusal (`http`), or the route's
    assert error["param"] in ("http", "prompt") and error["code"] == 400
    assert "\n" not in error["message"]
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


# ------------------------------------------------- case 4: templates off the loop


@pytest.mark.parametrize("route", ["/tokenize", "/v1/chat/completions"])
def test_every_template_render_runs_off_the_event_loop(tiny, monkeypatch, route):
    """A model's template may run for seconds (a GGUF one is stopped at 2 s): no route
    renders it on the event loop, where /health waits behind it."""
    url, _, worker = tiny
    tokenizer = worker.engine.tokenizer
    render = tokenizer.encode_chat
    on_loop: list[bool] = []

    def recorded(messages):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # no loop runs in this thread
            on_loop.append(False)
        return render(messages)

    monkeypatch.setattr(tokenizer, "encode_chat", recorded)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if route == "/tokenize":
        body = {"messages": body["messages"]}
    response = httpx.post(f"{url}{route}", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    assert on_loop == [False]
