"""The HTTP routes: OpenAI's completions, chat completions and models, /health, /metrics.

Each generation request is checked in one order (key 401, content type 415, size 413 and
read time 408, body 400, model 404, readiness and queue 503, context and limits 400),
handed to the engine worker, then answered whole or streamed as server-sent events, a
chunk per engine step. Every error answer is OpenAI's shape with `param` naming what to
change. A client that leaves mid-request has its request aborted, so its KV blocks are
free by the next step.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from pipeline.schema import ServeConf
from pipeline.serve.guards import (
    HostCheck,
    Problem,
    answered_hosts,
    check_key,
    checked_body,
    http_problem,
    problem_response,
    server_problem,
)
from pipeline.serve.logprobs import output_logprobs
from pipeline.serve.protocol import (
    ChatBody,
    CompletionBody,
    GenerationBody,
    RequestError,
    UsageMode,
    parse,
    to_request,
)
from pipeline.serve.replies import Reply, ReplyKind, Serving, TextStream, usage_counts
from pipeline.serve.telemetry import Telemetry
from pipeline.serve.tokenize import encode_chat, tokenizer_routes
from pipeline.serve.worker import EngineWorker, Finished, Stream

DISCONNECTED = "aborted: the client disconnected"


def create_app(
    settings: ServeConf,
    max_model_len: int,
    make_worker: Callable[[asyncio.AbstractEventLoop], EngineWorker],
) -> FastAPI:
    """The app; its lifespan starts the engine worker and stops it at shutdown."""
    shutdown_timeout_s = settings.shutdown_timeout_s

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = make_worker(asyncio.get_running_loop())
        app.state.worker = worker
        worker.start()
        yield
        await asyncio.to_thread(worker.stop, shutdown_timeout_s)

    # With a key, the API's description is closed too (it would list the routes to anyone).
    docs = {} if not settings.api_key else {"docs_url": None, "redoc_url": None,
                                                 "openapi_url": None}  # fmt: skip
    app = FastAPI(title="hpu-pipeline", lifespan=lifespan, **docs)
    app.state.serving = Serving(settings, max_model_len)
    app.add_exception_handler(Problem, lambda request, err: problem_response(err))
    app.add_exception_handler(HTTPException, http_problem)
    app.add_exception_handler(Exception, server_problem)  # a bug: still OpenAI's shape
    app.include_router(probe_routes)
    app.include_router(openai_routes)
    app.include_router(tokenizer_routes)
    answered = answered_hosts(settings.host, list(settings.allowed_hosts))
    app.add_middleware(HostCheck, answered=answered)
    return app


# /health and /metrics: for load balancers and Prometheus, open without a key.
probe_routes = APIRouter()


@probe_routes.get("/health")
async def health(request: Request) -> Response:
    worker: EngineWorker = request.app.state.worker
    if worker.failed:
        return JSONResponse({"status": "failed", "error": worker.failed}, status_code=503)
    if not worker.ready.is_set():
        return JSONResponse({"status": "not ready"}, status_code=503)
    return JSONResponse({"status": "ok"})


@probe_routes.get("/metrics")
async def metrics(request: Request) -> Response:
    telemetry: Telemetry = request.app.state.worker.telemetry
    return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)


# OpenAI's API: models, completions, chat completions.
openai_routes = APIRouter(prefix="/v1")


@openai_routes.get("/models")
async def models(request: Request) -> Response:
    serving: Serving = request.app.state.serving
    settings = serving.settings
    check_key(request, settings.api_key)
    model = {"id": settings.model_name, "object": "model", "created": 0,
             "owned_by": "hpu-pipeline", "max_model_len": serving.max_model_len}  # fmt: skip
    return JSONResponse({"object": "list", "data": [model]})


@openai_routes.post("/completions")
async def completions(request: Request) -> Response:
    worker, body = await accept(request, CompletionBody)
    tokenizer = worker.engine.tokenizer
    try:
        prompt = body.prompt_text()
    except RequestError as err:
        raise Problem(400, str(err), err.param) from None
    if isinstance(prompt, list):
        bad = [i for i in prompt if not 0 <= i < tokenizer.vocab_size]
        if bad:
            raise Problem(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                          f"(0..{tokenizer.vocab_size - 1})", "prompt")  # fmt: skip
        ids, prompt = prompt, tokenizer.decode(prompt)
    else:  # "" is no prompt, whatever tokens the tokenizer would add to it
        ids = tokenizer.encode(prompt) if prompt else []
    reply = request.app.state.serving.reply(ReplyKind.TEXT_COMPLETION, body.shown())
    return await generate(request, worker, body, reply, prompt, ids, body.limit())


@openai_routes.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    worker, body = await accept(request, ChatBody)
    tokenizer = worker.engine.tokenizer
    # the model's chat template, as for jsonl `messages` (stages/loading/chat.py)
    prompt, ids = await encode_chat(tokenizer, body.messages)
    reply = request.app.state.serving.reply(ReplyKind.CHAT_COMPLETION, body.shown())
    return await generate(request, worker, body, reply, prompt, ids, body.limit())


async def accept(request: Request, body_type: type[GenerationBody]) -> tuple[EngineWorker, Any]:
    """The checks every generation request passes, in the order the module names."""
    settings = request.app.state.serving.settings
    body = await checked_body(request, lambda raw: parse(body_type, raw))
    worker: EngineWorker = request.app.state.worker
    if not worker.ready.is_set():
        raise Problem(503, "the server is not ready (loading, warming up or stopping)",
                      headers={"Retry-After": "5"})  # fmt: skip
    if worker.waiting >= settings.max_waiting:
        message = f"{worker.waiting} requests wait, serve.max_waiting={settings.max_waiting}"
        raise Problem(503, f"{message}: retry later", headers={"Retry-After": "1"})
    return worker, body


async def generate(
    request: Request,
    worker: EngineWorker,
    body: GenerationBody,
    reply: Reply,
    prompt: str,
    ids: list[int],
    limit: int | None,
) -> Response:
    """Hands the request to the engine worker; answers it whole or as a stream."""
    engine = worker.engine
    ident = (reply.id, reply.index)
    max_model_len = request.app.state.serving.max_model_len
    source = "prompt" if isinstance(body, CompletionBody) else "messages"
    check_context(len(ids), limit, max_model_len, source)
    job = to_request(body, prompt, ids, limit, max_model_len, ident, engine.clock())
    reason = engine.rejection(job)
    if reason:
        raise Problem(400, reason, reason_field(reason, body, source))
    try:
        stream = worker.submit(job, streamed=body.stream)
    except RuntimeError as err:
        raise Problem(503, str(err), headers={"Retry-After": "5"}) from None
    if body.stream:
        events = stream_events(request, worker, stream, reply, body.usage_mode)
        return StreamingResponse(events, media_type="text/event-stream")
    await wait_for_end(request, worker, stream)
    if stream.request.error:
        status = 503 if stream.request.error.startswith("aborted") else 500
        raise Problem(status, stream.request.error)
    return Response(orjson.dumps(reply.whole(stream.request, engine.tokenizer)),
                    media_type="application/json")  # fmt: skip


def check_context(prompt: int, limit: int | None, max_model_len: int, source: str) -> None:
    """400 where the prompt and the output asked for do not fit the context (as vLLM)."""
    if prompt >= max_model_len:
        message = (f"the {source} has {prompt} tokens, this model's context is "
                   f"{max_model_len} tokens and leaves no room for output: shorten it")  # fmt: skip
        raise Problem(400, message, source)
    if limit is not None and prompt + limit > max_model_len:
        raise Problem(400, f"this model's maximum context length is {max_model_len} tokens, "
                      f"you requested {prompt + limit} ({prompt} in the {source}, {limit} in "
                      "the completion): reduce max_tokens or the prompt", "max_tokens")  # fmt: skip


async def wait_for_end(request: Request, worker: EngineWorker, stream: Stream) -> None:
    """Waits for the request's end; aborts it if the client disconnects first."""
    left = asyncio.ensure_future(disconnected(request))
    ended = asyncio.ensure_future(stream.queue.get())
    try:
        await asyncio.wait({left, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not ended.done():
            ended.cancel()
            worker.abort(stream.request, DISCONNECTED)


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def stream_events(
    request: Request, worker: EngineWorker, stream: Stream, reply: Reply, usage_mode: UsageMode
) -> AsyncIterator[bytes]:
    """Server-sent events: a chunk of text per engine step (with the usage so far, where
    asked, and its tokens' logprobs, where asked), the finish, usage, [DONE]."""
    include_usage = usage_mode is not UsageMode.NONE
    tokenizer = worker.engine.tokenizer
    text = TextStream(tokenizer, stream.request.stop)
    ended, delivered = False, 0
    try:
        first = reply.opening_chunk(include_usage)
        if first:
            yield first
        while not ended:
            event = await stream.queue.get()
            ended = isinstance(event, Finished)
            ids = event.ids if ended else event
            delta = text.final(stream.request, ids) if ended else text.add(ids)
            start, delivered = delivered, delivered + len(ids)
            logprobs = output_logprobs(stream.request, tokenizer, reply.shown, reply.chat,
                                       start, delivered)  # fmt: skip
            if delta or logprobs:
                counts = None
                if usage_mode is UsageMode.CONTINUOUS:
                    counts = usage_counts(len(stream.request.prompt_ids), len(text.ids))
                yield reply.chunk(delta, include_usage, counts, logprobs)
        yield reply.closing_chunks(stream.request, include_usage)
        yield b"data: [DONE]\n\n"
    finally:
        if not ended:  # the client left, or the server cancelled the response
            worker.abort(stream.request, DISCONNECTED)


def reason_field(reason: str, body: BaseModel, fallback: str) -> str:
    """The body field a rejection starts with (`top_k=...`, `logprobs: ...`), else
    `fallback`: the error names the field to change."""
    name = re.split(r"[^a-z_]", reason, maxsplit=1)[0]
    return name if name in type(body).model_fields else fallback
