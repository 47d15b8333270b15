"""What every route checks before it reads a request (the key, the content type, the body's
size and arrival time) and every error answer in OpenAI's shape, `param` naming what to
change."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from pipeline.serve.protocol import RequestError, echoed
from pipeline.serve.replies import Serving

MAX_MESSAGE_CHARS = 1000  # the longest error the server writes itself is a few hundred


class Problem(Exception):
    """An error answer: status, message, and the field it is about."""

    def __init__(
        self, status: int, message: str, param: str | None = None, headers: dict | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.headers = status, param, headers


def http_problem(request: Request, err: Exception) -> JSONResponse:
    """Starlette's own answers (404 no such route, 405 wrong method) in OpenAI's shape."""
    assert isinstance(err, HTTPException)
    where = f"{request.method} {echoed(request.url.path)}"
    return problem_response(Problem(err.status_code, f"{where}: {err.detail}", "path",
                                    dict(err.headers or {})))  # fmt: skip


def server_problem(request: Request, err: Exception) -> JSONResponse:
    return problem_response(Problem(500, f"internal error: {type(err).__name__}: {err}"))


def problem_response(err: Problem) -> JSONResponse:
    """The answer in OpenAI's shape; a message is cut at MAX_MESSAGE_CHARS whatever it
    repeats of the request."""
    kind = "invalid_request_error" if err.status < 500 else "server_error"
    message = echoed(str(err), MAX_MESSAGE_CHARS)
    body = {"error": {"message": message, "type": kind, "param": err.param, "code": err.status}}
    return JSONResponse(body, status_code=err.status, headers=err.headers)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


def answered_hosts(bind_host: str, allowed: Sequence[str]) -> frozenset[str] | None:
    """The Host header names the server answers (None: any): serve.allowed_hosts, or by
    default, where it listens on loopback, the loopback names alone. A page on another
    site whose name its DNS turns into 127.0.0.1 (DNS rebinding) sends its own name, and
    with it could read the answers of a server without a key."""
    names = {name.lower() for name in allowed}
    if "*" in names:
        return None
    if names:
        return frozenset(names)
    loopback = bind_host in ("localhost", "::1") or bind_host.startswith("127.")
    return LOOPBACK_NAMES if loopback else None


def host_name(header: str) -> str:
    """The name of a Host header (`name:port`, `[v6]:port`), lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """Answers a request whose Host names no server name with 400 (param `host`), before
    any route reads it (ASGI middleware: streams pass through untouched)."""

    def __init__(self, app: ASGIApp, answered: frozenset[str] | None) -> None:
        self.app, self.answered = app, answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.answered is not None:
            headers = dict(scope.get("headers") or [])
            name = host_name(headers.get(b"host", b"").decode("latin-1"))
            if name not in self.answered:
                problem = Problem(400, f"Host {echoed(repr(name))} is not a name this server "
                                  "answers to: use localhost, or add the name to "
                                  "serve.allowed_hosts", "host")  # fmt: skip
                await problem_response(problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_json(request: Request) -> None:
    """415 for a body not declared JSON: a web page's form or text/plain POST (sent without
    a CORS preflight) cannot drive a local server."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not (
        kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))
    ):
        shown = echoed(repr(kind or "(none)"))
        raise Problem(415, f"Content-Type {shown} is not accepted: send the body as "
                      "application/json", "content-type")  # fmt: skip


def check_key(request: Request, api_key: str) -> None:
    if not api_key:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise Problem(401, "a valid API key is required: send 'Authorization: Bearer KEY'",
                      "authorization")  # fmt: skip


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, or 413 as soon as it is known to exceed `limit` bytes, or 408 when it has
    not all come within `timeout_s` (a client holding the connection open)."""
    too_large = Problem(413, f"the request body exceeds serve.max_request_bytes={limit}", "body")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise Problem(408, f"the body did not arrive within serve.body_timeout_s={timeout_s:g}",
                      "body", {"Connection": "close"}) from None  # fmt: skip
    except ClientDisconnect:
        raise Problem(400, "the client left before sending the whole body", "body") from None
    return b"".join(chunks)


class ForAModel(Protocol):
    model: str | None  # the model a request names (None: the served one)


B = TypeVar("B", bound=ForAModel)


async def checked_body(request: Request, parse: Callable[[bytes], B]) -> B:
    """The checks every POST route makes before it reads a request, in order: key 401,
    content type 415, size 413 and read time 408, body 400 (`parse`), model 404."""
    serving: Serving = request.app.state.serving
    settings = serving.settings
    check_key(request, settings.api_key)
    check_json(request)
    raw = await read_body(request, settings.max_request_bytes, settings.body_timeout_s)
    try:
        body = parse(raw)
    except RequestError as err:
        raise Problem(400, str(err), err.param) from None
    if body.model is not None and body.model != settings.model_name:
        raise Problem(404, f"model '{echoed(body.model)}' is not served here: "
                      f"GET /v1/models lists '{settings.model_name}'", "model")  # fmt: skip
    return body
