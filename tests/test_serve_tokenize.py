"""The tokenizer routes over real HTTP (vLLM's shapes): the tiny model's tokenizer is UTF-8
bytes with BOS 256 first, so the oracle is the text's own bytes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from pipeline.serve.worker import EngineWorker
from tests.test_serve import AUTH, SERVER, running_server

TEXT = "Café au lait, 2 × 3"
BOS = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, EngineWorker]]:
    with running_server(SERVER, tmp_path_factory.mktemp("serve")) as running:
        yield running


def post(url: str, route: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}{route}", json=body, headers=AUTH if headers is None else headers,
                      timeout=60)  # fmt: skip


def test_tokenize_gives_the_texts_bytes(server):
    url, worker = server
    reply = post(url, "/tokenize", {"prompt": TEXT, "return_token_strs": True}).json()
    assert reply["tokens"] == [BOS, *TEXT.encode()]
    assert reply["count"] == len(TEXT.encode()) + 1
    assert reply["max_model_len"] == 256
    assert reply["token_strs"][1] == "C"
    plain = post(url, "/tokenize", {"prompt": TEXT, "add_special_tokens": False}).json()
    assert plain["tokens"] == list(TEXT.encode()) and plain["token_strs"] is None


def test_tokenize_messages_as_the_chat_route_does(server):
    url, worker = server
    messages = [{"role": "user", "content": TEXT}]
    reply = post(url, "/tokenize", {"messages": messages}).json()
    text, _ = worker.engine.tokenizer.encode_chat(messages)
    assert TEXT in text
    assert reply["tokens"] == [BOS, *text.encode()]


def test_detokenize_inverts_tokenize(server):
    url, _ = server
    ids = post(url, "/tokenize", {"prompt": TEXT}).json()["tokens"]
    assert post(url, "/detokenize", {"tokens": ids}).json() == {"prompt": TEXT}


def test_tokenizer_info_names_the_specials(server):
    url, _ = server
    info = httpx.get(f"{url}/tokenizer_info", headers=AUTH, timeout=60).json()
    assert info["bos_token_id"] == BOS and info["eos_token_ids"] == [257]
    assert info["vocab_size"] == 259 and info["model_max_length"] == 256
    assert {"eos_token", "bos_token", "chat_template", "tokenizer_class"} <= info.keys()


@pytest.mark.parametrize(
    "route, body, status, param",
    [
        (
            "/tokenize",
            {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},
            400,
            "prompt",
        ),  # fmt: skip
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/detokenize", {"tokens": [259]}, 400, "tokens"),
        ("/detokenize", {"tokens": "ab"}, 400, "tokens"),
    ],
)
def test_bad_tokenizer_requests(server, route, body, status, param):
    reply = post(server[0], route, body)
    assert reply.status_code == status
    assert reply.json()["error"]["param"] == param


def test_the_tokenizer_routes_ask_the_key(server):
    url, _ = server
    assert post(url, "/tokenize", {"prompt": "x"}, headers={}).status_code == 401
    assert httpx.get(f"{url}/tokenizer_info", timeout=60).status_code == 401
