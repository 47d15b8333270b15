"""OpenAI's response bodies and stream chunks, and the text a stream sends step by step."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.run_folder.records import output_text
from pipeline.schema import ServeConf
from pipeline.serve.logprobs import Shown, whole_logprobs
from stages.interfaces import Tokenizer
from stages.scheduling.request import Request


class TextStream:
    """A request's text as its tokens come: each step sends what can no longer change.

    Held back are a cut-off character at the end (its next bytes are still to come) and,
    with stop strings, the text from the first stop string found, and any end of the text
    that a stop string begins with: the stop string that ends the request is never sent, not
    even in part (its tokens reach the stream before the request is seen to stop). The last
    delta makes the sent text the request's final text (records.output_text, as
    generations.jsonl holds it)."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.sent = 0  # characters sent

    def add(self, ids: list[int]) -> str:
        self.ids += ids
        text = self.tokenizer.decode(self.ids).rstrip("\ufffd")
        safe = self._safe_end(text)
        if safe <= self.sent:
            return ""
        delta, self.sent = text[self.sent : safe], safe
        return delta

    def _safe_end(self, text: str) -> int:
        """Where the text that can no longer change ends."""
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            return min(cuts)
        for start in range(max(0, len(text) - max(map(len, self.stop), default=0)), len(text)):
            if any(s.startswith(text[start:]) for s in self.stop):
                return start
        return len(text)

    def final(self, request: Request, ids: list[int]) -> str:
        self.ids += ids
        text = output_text(request, self.tokenizer)
        delta, self.sent = text[self.sent :], len(text)
        return delta


def usage_counts(prompt: int, output: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def usage(request: Request, shown: Shown | None = None) -> dict[str, Any]:
    """`shown`: with `max_tokens: 0` the token run to score the prompt is not an output."""
    output = len(request.output_ids) if shown is None or shown.output else 0
    counts = usage_counts(request.num_prompt_tokens, output)
    return {**counts, "prompt_tokens_details": {"cached_tokens": request.cached_tokens}}


class ReplyKind(enum.StrEnum):
    """The OpenAI object a reply is (a streamed chat chunk adds `.chunk`)."""

    TEXT_COMPLETION = "text_completion"
    CHAT_COMPLETION = "chat.completion"


@dataclass
class Reply:
    """One request's answer, whole or as chunks."""

    kind: ReplyKind
    index: int
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    shown: Shown = field(default_factory=Shown)  # logprobs, echo

    @property
    def chat(self) -> bool:
        return self.kind is ReplyKind.CHAT_COMPLETION

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.index}"

    def _head(self, streaming: bool) -> dict[str, Any]:
        kind = f"{self.kind}.chunk" if streaming and self.chat else self.kind
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(
        self, text: str | None, finish: str | None, streaming: bool, logprobs: Any = None
    ) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if streaming:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def whole(self, request: Request, tokenizer: Tokenizer) -> dict[str, Any]:
        shown = self.shown
        text = output_text(request, tokenizer) if shown.output else ""
        if shown.echo:
            text = request.prompt + text
        logprobs = whole_logprobs(request, tokenizer, shown, self.chat)
        choice = self._choice(text, request.finish_reason, False, logprobs)
        return {**self._head(False), "choices": [choice], "usage": usage(request, shown)}

    def _event(self, body: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def _chunk_body(
        self, choices: list, include_usage: bool, counts: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        body = {**self._head(True), "choices": choices}
        if include_usage:
            body["usage"] = counts  # None but with continuous_usage_stats
        return body

    def opening_chunk(self, include_usage: bool) -> bytes | None:
        """A chat stream opens with the assistant's role; a completion stream has none."""
        if not self.chat:
            return None
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}  # fmt: skip
        return self._event(self._chunk_body([choice], include_usage))

    def chunk(
        self,
        text: str,
        include_usage: bool,
        counts: dict[str, Any] | None = None,
        logprobs: Any = None,
    ) -> bytes:
        """A delta of text; `counts`: the usage so far (continuous_usage_stats); `logprobs`:
        those of the tokens the step produced, where asked."""
        choice = self._choice(text, None, True, logprobs)
        return self._event(self._chunk_body([choice], include_usage, counts))

    def closing_chunks(self, request: Request, include_usage: bool) -> bytes:
        """The finish reason (or the error), then usage when asked for."""
        if request.error:
            error = {"message": request.error, "type": "server_error", "code": 500}
            return self._event({"error": error})
        choice = self._choice(None if self.chat else "", request.finish_reason, streaming=True)
        out = self._event(self._chunk_body([choice], include_usage))
        if include_usage:
            out += self._event({**self._head(True), "choices": [], "usage": usage(request)})
        return out


@dataclass
class Serving:
    """What the routes read besides the worker: the serve settings, the context limit,
    and the count that numbers replies."""

    settings: ServeConf
    max_model_len: int
    numbers: Iterator[int] = field(default_factory=itertools.count)

    def reply(self, kind: ReplyKind, shown: Shown) -> Reply:
        return Reply(kind, next(self.numbers), self.settings.model_name, shown=shown)
