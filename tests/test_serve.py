"""The OpenAI-compatible server over real HTTP on a free loopback port: the batch run's
greedy tokens through the real `openai` client, every error answer, and KV blocks freed
when clients disconnect."""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from openai import OpenAI

from pipeline.executors import build_engine
from pipeline.executors.allocator import HeapTrimmer
from pipeline.serve.__main__ import prepare
from pipeline.serve.api import create_app
from pipeline.serve.derived import serve_settings
from pipeline.serve.telemetry import Telemetry
from pipeline.serve.worker import EngineWorker
from stages.scheduling.request import Request
from tests.conftest import make_config

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
PROMPTS = ["The quick brown fox", "Paged attention keeps", "a", "Chunked prefill " * 9]
SERVER = ["model=tiny", "max_num_seqs=4", "max_tokens=64", f"serve.api_key={KEY}"]


@contextmanager
def running_server(overrides: list[str], out_dir: Path) -> Iterator[tuple[str, EngineWorker]]:
    """The server of `python -m pipeline.serve overrides` in a thread, on a port the OS
    picked on 127.0.0.1; yields its base URL once /health says it is ready."""
    cfg = make_config(overrides)
    prepare(cfg, "tiny")
    workers: list[EngineWorker] = []

    def make_worker(loop: asyncio.AbstractEventLoop) -> EngineWorker:
        workers.append(EngineWorker(cfg, out_dir, loop, Telemetry("tiny"), lambda err: None))
        return workers[-1]

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app(serve_settings(cfg), cfg.max_model_len, make_worker)
    config = uvicorn.Config(app, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        deadline = time.monotonic() + 120
        while not (workers and workers[0].ready.is_set()):
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        yield url, workers[0]
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, EngineWorker]]:
    with running_server(SERVER, tmp_path_factory.mktemp("serve")) as running:
        yield running


def batch_texts(max_new_tokens: int) -> list[tuple[str, int]]:
    """The oracle: the same prompts as one batch run (the engine alone, no server)."""
    engine, _ = build_engine(make_config(SERVER))
    requests = [
        Request(str(i), i, p, engine.tokenizer.encode(p), max_new_tokens)
        for i, p in enumerate(PROMPTS)
    ]
    engine.run(requests)
    from pipeline.run_folder.records import output_text

    return [(output_text(r, engine.tokenizer), len(r.output_ids)) for r in requests]


def test_greedy_tokens_through_the_openai_client_equal_the_batch_run(server):
    url, _ = server
    expected = batch_texts(12)
    client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)

    def whole(prompt: str) -> tuple[str, int]:
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=12)
        return out.choices[0].text, out.usage.completion_tokens

    def streamed(prompt: str) -> tuple[str, int]:
        chunks = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        text, used = "", None
        for chunk in chunks:
            text += "".join(c.text for c in chunk.choices)
            used = chunk.usage.completion_tokens if chunk.usage else used
        return text, used

    # All at once from threads, so the server batches them as it likes.
    results: dict[tuple[str, int], tuple[str, int]] = {}
    threads = [
        threading.Thread(target=lambda f=f, i=i, p=p: results.__setitem__((f.__name__, i), f(p)))
        for i, p in enumerate(PROMPTS)
        for f in (whole, streamed)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(len(PROMPTS)):
        assert results[("whole", i)] == expected[i]
        assert results[("streamed", i)] == expected[i]


def test_chat_uses_the_plain_template_and_reports_usage(server):
    url, _ = server
    client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    # The byte tokenizer: BOS, then one id per byte of "<|user|>\nHi\n<|assistant|>\n".
    assert out.usage.prompt_tokens == 1 + len("<|user|>\nHi\n<|assistant|>\n")
    assert out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, "body"),
        (b"[1, 2]", 400, "body"),
        (json.dumps({"prompt": "x", "max_tokens": "8"}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n"),
        (json.dumps({"prompt": "x", "logit_bias": {"5": 1.0}}).encode(), 400, "logit_bias"),
        (json.dumps({"prompt": "x", "frobnicate": 1}).encode(), 400, "frobnicate"),
        (json.dumps({"prompt": "x", "stream_options": {"include_usage": 1}}).encode(), 400,
         "stream_options"),
        (json.dumps({"prompt": "x", "model": "other"}).encode(), 404, "model"),
        (json.dumps({"prompt": "x" * 300}).encode(), 400, "prompt"),  # beyond max_model_len
        (json.dumps({"prompt": "x" * 2_000_000}).encode(), 413, "body"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_clear_4xx_naming_the_field(server, body, status, param):
    url, _ = server
    response = httpx.post(f"{url}/v1/completions", content=body, headers=AUTH, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    if param:
        assert param.split(".")[0] in error["message"]


def test_a_missing_or_wrong_key_gets_401_and_health_needs_none(server):
    url, _ = server
    body = {"prompt": "x", "max_tokens": 1}
    assert httpx.post(f"{url}/v1/completions", json=body).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=wrong).status_code == 401
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"] == "tiny"
    assert httpx.get(f"{url}/health").status_code == 200


def test_not_ready_and_a_full_queue_get_503(server, monkeypatch):
    url, worker = server
    body = {"prompt": "x", "max_tokens": 1}
    monkeypatch.setattr(EngineWorker, "waiting", property(lambda self: 10**6))
    full = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH)
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    worker.ready.clear()
    try:
        assert httpx.get(f"{url}/health").status_code == 503
        assert httpx.post(f"{url}/v1/completions", json=body, headers=AUTH).status_code == 503
    finally:
        worker.ready.set()


def kv_free(url: str) -> tuple[float, float, float]:
    """Free and total KV blocks, and running requests, as /metrics says."""
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return (
        values["hpu_pipeline:kv_blocks_free"],
        values["hpu_pipeline:kv_blocks_total"],
        values["vllm:num_requests_running"],
    )


async def leave_after(url: str, chunks: int) -> None:
    """A streaming client that reads `chunks` events of a long request, then disconnects."""
    body = {"prompt": "Long story: ", "max_tokens": 200, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(headers=AUTH, timeout=60) as client:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data:")
                if seen >= chunks:
                    break


async def leave_while_running(url: str) -> None:
    """A client that waits for a whole (unstreamed) reply and hangs up once the server runs
    its request: the request is long enough that no machine finishes it first."""
    body = {"prompt": "Long story: ", "max_tokens": 240, "ignore_eos": True}
    async with httpx.AsyncClient(headers=AUTH, timeout=60) as client:
        reply = asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body))
        while kv_free(url)[2] == 0:
            assert not reply.done(), reply.result().text
            await asyncio.sleep(0.01)
        assert not reply.done()
        reply.cancel()


def test_a_client_that_disconnects_frees_every_kv_block(server):
    url, worker = server
    free, total, _ = kv_free(url)
    assert free == total

    async def clients() -> None:
        await asyncio.gather(*(leave_after(url, 3) for _ in range(3)))
        while kv_free(url)[2]:  # the server has let go of the streams
            await asyncio.sleep(0.05)
        await leave_while_running(url)

    asyncio.run(clients())
    deadline = time.monotonic() + 30
    while kv_free(url)[0] != total or kv_free(url)[2]:
        assert time.monotonic() < deadline, f"blocks still held: {kv_free(url)}"
        time.sleep(0.05)
    aborted = [
        json.loads(line)
        for line in (worker.out_dir / "generations.jsonl").read_text().splitlines()
        if "disconnected" in line
    ]
    assert len(aborted) == 4
    assert all(len(g["output_ids"]) < 200 for g in aborted)


@pytest.mark.slow
def test_64_streaming_clients_with_early_disconnects_leave_no_errors_and_no_blocks(tmp_path):
    """The soak's short version: 64 streaming clients, 10% hang up early."""
    from benchmarks.serve_load import Load, run_load, synthetic_prompts

    overrides = ["model=tiny", "max_num_seqs=64", "max_tokens=256"]
    with running_server(overrides, tmp_path) as (url, worker):
        prompts = synthetic_prompts(192, 40, 12, seed=1)
        load = Load(url, prompts, concurrency=64, disconnect_fraction=0.1, seed=1)
        result = asyncio.run(run_load(load))
        assert result["failed"] == 0, result["errors"]
        assert result["disconnected"] > 0
        assert result["completed"] + result["disconnected"] == len(prompts)
        assert result["total_output_tokens"] == 12 * result["completed"]
        deadline = time.monotonic() + 30
        while kv_free(url)[0] != kv_free(url)[1] or kv_free(url)[2]:
            assert time.monotonic() < deadline, f"blocks still held: {kv_free(url)}"
            time.sleep(0.05)
    lines = (tmp_path / "generations.jsonl").read_text().splitlines()
    assert len(lines) == len(prompts)  # every request ended exactly once
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["num_requests"] == len(prompts)
    # A client may hang up after the server has sent its last token: that request is served.
    assert 0 < metrics["num_errors"] <= result["disconnected"]


@pytest.mark.slow
def test_sigterm_stops_accepting_aborts_in_flight_work_and_exits_0(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    overrides = ["model=tiny", f"serve.port={port}", "serve.shutdown_timeout_s=1",
                 f"hydra.run.dir={tmp_path}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.serve", *overrides], cwd=tmp_path, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.2)
        body = {"prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data:")  # the request is running
            server.send_signal(signal.SIGTERM)
            assert server.wait(60) == 0
            assert any("server stopped" in line for line in lines)
    finally:
        if server.poll() is None:
            server.kill()
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "ok"
    (line,) = (tmp_path / "generations.jsonl").read_text().splitlines()
    assert json.loads(line)["error"].startswith("aborted: the server stopped")


def test_the_digital_twin_answers_no_sooner_than_the_device_it_simulates(tmp_path):
    """executor=simulated: each step's predicted time passes in real time before its
    tokens go out, so a request takes at least its simulated time (a lower bound, true on
    any machine however fast)."""
    twin = ["executor=simulated", "hardware=gaudi3", "model=spec/ernie45_0p3b", "warmup=true",
            "max_num_seqs=4", "max_model_len=512"]  # fmt: skip
    prompt, new_tokens = "a prompt of some length " * 8, 24
    engine, _ = build_engine(make_config(twin))
    engine.warmup()
    alone = Request("r", 0, prompt, engine.tokenizer.encode(prompt), new_tokens)
    predicted = engine.run([alone])  # on the virtual clock: the device's predicted seconds
    assert predicted > 0 and len(alone.output_ids) == new_tokens
    with running_server(twin, tmp_path) as (url, _):
        body = {"prompt": prompt, "max_tokens": new_tokens, "ignore_eos": True}
        start = time.perf_counter()
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        waited = time.perf_counter() - start
    assert reply.json()["usage"]["completion_tokens"] == new_tokens
    assert waited >= predicted


def live_objects() -> collections.Counter:
    """The process's objects the collector tracks, by type, once garbage is collected."""
    gc.collect()
    return collections.Counter(type(o) for o in gc.get_objects())


# abc's isinstance caches: weak references (and their callbacks), refilled when an import
# registers a class; as many as there are abstract classes and types, whatever is served.
CACHES = ("weakref.ReferenceType", "builtins.builtin_function_or_method")


def grown_since(before: collections.Counter, limit: int) -> dict[str, int]:
    """The object counts (by type, caches left out) that grew since `before`, waiting (30 s
    at most) while they total `limit` or more: uvicorn closes a connection just after its
    client has left."""
    deadline = time.monotonic() + 30
    while True:
        after = live_objects()
        grown = {f"{kind.__module__}.{kind.__qualname__}": n - before[kind]
                 for kind, n in after.items() if n > before[kind]}  # fmt: skip
        grown = {name: n for name, n in grown.items() if name not in CACHES}
        if sum(grown.values()) < limit or time.monotonic() > deadline:
            return grown
        time.sleep(0.1)


def test_a_server_keeps_no_object_per_request_it_served(server):
    """Once its requests have ended, what a server holds does not grow with the requests
    it served: fewer than one more object per request (abc's caches aside), and of the
    requests only the last step's (each tensor a step made with paddle.to_tensor left a
    list behind, a dozen a step)."""
    url, worker = server

    async def round_of(count: int) -> None:
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as client:
            bodies = [{"prompt": p, "max_tokens": 8, "ignore_eos": True, "stream": i % 2 == 1}
                      for i, p in enumerate(PROMPTS * (count // len(PROMPTS)))]  # fmt: skip
            answers = await asyncio.gather(
                *(client.post(f"{url}/v1/completions", json=b) for b in bodies)
            )
            assert all(a.status_code == 200 for a in answers)

    asyncio.run(round_of(16))  # what is made once, and what 16 connections at once hold
    before = live_objects()
    served = 32
    for _ in range(served // 16):
        asyncio.run(round_of(16))
    grown = grown_since(before, served)
    assert sum(grown.values()) < served, grown  # fewer than one object per request
    assert (
        grown.get("stages.scheduling.request.Request", 0) <= worker.cfg.max_num_seqs
    )  # the last step's
    assert not worker.streams and kv_free(url)[0] == kv_free(url)[1]


def test_the_heap_is_trimmed_no_more_often_than_asked():
    never, always = HeapTrimmer(0), HeapTrimmer(1e-9)
    for _ in range(3):
        never.maybe_trim()
        always.maybe_trim()
    assert never.trims == 0 and always.trims == 3
