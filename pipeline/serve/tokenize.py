"""The tokenizer's routes, as vLLM names them: POST /tokenize, POST /detokenize and
GET /tokenizer_info, so a client (lm-eval's `tokenizer_backend=remote`) counts and cuts
tokens with the served model's own tokenizer and downloads none.

/tokenize takes `prompt` (text; `add_special_tokens`, default true, puts BOS first where
the tokenizer does) or chat `messages` (under the model's chat template, with the
assistant's opening); it answers `count`, `max_model_len`, `tokens` and, with
`return_token_strs`, each token's text. /detokenize takes `tokens` and answers `prompt`.
Each asks the API key as the generation routes do.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pipeline.serve.guards import Problem, check_key, checked_body
from pipeline.serve.protocol import ChatMessage, Strict, parse_body
from pipeline.serve.replies import Serving
from stages.interfaces import Tokenizer

tokenizer_routes = APIRouter()


class ModelBody(Strict):
    model: str | None = None


M = TypeVar("M", bound=ModelBody)


class TokenizeBody(ModelBody):
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeBody(ModelBody):
    tokens: list[int]


async def encode_chat(tokenizer: Tokenizer, messages: list[ChatMessage]) -> tuple[str, list[int]]:
    """The chat's prompt and ids under the model's chat template, rendered off the event
    loop (a child process with a time limit renders a model's own template,
    stages/loading/template_worker.py): /health answers meanwhile. The one way every route
    renders a template; a template that fails is a 400 naming `messages`."""
    turns = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        return await asyncio.to_thread(tokenizer.encode_chat, turns)
    except ValueError as err:
        raise Problem(400, str(err), "messages") from None


async def tokenizer_of(request: Request, body_type: type[M]) -> tuple[Tokenizer, M]:
    """The checks of these routes (key, content type, size, body, model), as the
    generation routes', and the served tokenizer."""
    body = await checked_body(request, lambda raw: parse_body(body_type, raw))
    engine = request.app.state.worker.engine
    if engine is None:
        raise Problem(503, "the server is not ready (loading)", headers={"Retry-After": "5"})
    return engine.tokenizer, body


@tokenizer_routes.post("/tokenize")
async def tokenize(request: Request) -> Response:
    tokenizer, body = await tokenizer_of(request, TokenizeBody)
    if (body.prompt is None) == (body.messages is None):
        raise Problem(400, "give either `prompt` or `messages`", "prompt")
    if body.messages is not None:
        if not body.add_generation_prompt or body.add_special_tokens:
            raise Problem(400, "messages are tokenized with the generation prompt and no "
                          "added special tokens only", "add_generation_prompt")  # fmt: skip
        _, ids = await encode_chat(tokenizer, body.messages)
    else:
        ids = tokenizer.encode(body.prompt)
        if body.add_special_tokens is False and ids[:1] == [tokenizer.bos_id]:
            ids = ids[1:]  # the BOS the tokenizer puts first
    reply: dict[str, Any] = {"count": len(ids), "tokens": ids, "token_strs": None,
                             "max_model_len": request.app.state.serving.max_model_len}  # fmt: skip
    if body.return_token_strs:
        reply["token_strs"] = [tokenizer.decode([i]) for i in ids]
    return JSONResponse(reply)


@tokenizer_routes.post("/detokenize")
async def detokenize(request: Request) -> Response:
    tokenizer, body = await tokenizer_of(request, DetokenizeBody)
    bad = [i for i in body.tokens if not 0 <= i < tokenizer.vocab_size]
    if bad:
        raise Problem(400, f"tokens: token id {bad[0]} is outside the vocabulary "
                      f"(0..{tokenizer.vocab_size - 1})", "tokens")  # fmt: skip
    return JSONResponse({"prompt": tokenizer.decode(body.tokens)})


@tokenizer_routes.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> Response:
    serving: Serving = request.app.state.serving
    check_key(request, serving.settings.api_key)
    engine = request.app.state.worker.engine
    if engine is None:
        raise Problem(503, "the server is not ready (loading)", headers={"Retry-After": "5"})
    tokenizer: Tokenizer = engine.tokenizer
    return JSONResponse({
        "tokenizer_class": type(tokenizer).__name__,
        "vocab_size": tokenizer.vocab_size,
        "bos_token": tokenizer.bos_text or None,
        "eos_token": tokenizer.eos_text or None,
        "bos_token_id": tokenizer.bos_id,
        "eos_token_ids": sorted(tokenizer.eos_ids),
        "pad_token_id": tokenizer.pad_id,
        "chat_template": tokenizer.chat_template,
        "model_max_length": serving.max_model_len,
    })  # fmt: skip
