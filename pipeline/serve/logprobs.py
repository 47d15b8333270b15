"""Log-probabilities in OpenAI's two shapes, from what the engine kept on the request.

The values are the model's raw log-softmax (stages/sampling/logprobs.py: before temperature, top-k
and top-p, vLLM's default `logprobs_mode`). Completions: `tokens`, `token_logprobs`,
`top_logprobs` (token text -> log-probability: the k most likely and the scored token) and
`text_offset`, the prompt's first where `echo` asks (its first token has no log-probability:
null). Chat: `content`, one `{token, logprob, bytes, top_logprobs}` per output token, its
`top_logprobs` the k most likely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stages.interfaces import Tokenizer
from stages.scheduling.request import Request

# JSON has no -inf: a token the model rules out gets vLLM's stand-in.
FLOOR = -9999.0


@dataclass(frozen=True)
class Shown:
    """What a reply shows beside its text: `logprobs` alternatives per token (None: no
    log-probabilities), the prompt first (`echo`), and whether the output is kept (not
    with `max_tokens: 0`, where the request runs one token to score its prompt)."""

    logprobs: int | None = None
    echo: bool = False
    output: bool = True


def value(logprob: float) -> float:
    return max(logprob, FLOOR)


class Pieces:
    """Each token's own text, decoded once per reply."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._known: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        piece = self._known.get(token)
        if piece is None:
            piece = self._known[token] = self.tokenizer.decode([token])
        return piece


def completion_part(
    pieces: Pieces, ids: Sequence[int], entries: Sequence[dict[int, float] | None], offset: int
) -> dict[str, list]:
    """Completions' logprobs of `ids` (each with its entry; None: no log-probability), text
    offsets counted from `offset`."""
    part: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                             "text_offset": []}  # fmt: skip
    for token, entry in zip(ids, entries, strict=True):
        piece = pieces(token)
        part["tokens"].append(piece)
        part["text_offset"].append(offset)
        offset += len(piece)
        if entry is None:
            part["token_logprobs"].append(None)
            part["top_logprobs"].append(None)
        else:
            part["token_logprobs"].append(value(entry[token]))
            part["top_logprobs"].append({pieces(t): value(lp) for t, lp in entry.items()})
    return part


def chat_part(
    pieces: Pieces, ids: Sequence[int], entries: Sequence[dict[int, float]], k: int
) -> dict[str, list]:
    """Chat's logprobs of `ids`: `content`, one item per token with its k most likely."""

    def item(token: int, logprob: float) -> dict[str, Any]:
        piece = pieces(token)
        return {"token": piece, "logprob": value(logprob), "bytes": list(piece.encode())}

    content = []
    for token, entry in zip(ids, entries, strict=True):
        top = [item(t, lp) for t, lp in list(entry.items())[:k]]
        content.append({**item(token, entry[token]), "top_logprobs": top})
    return {"content": content}


def output_logprobs(
    request: Request, tokenizer: Tokenizer, shown: Shown, chat: bool, start: int, end: int
) -> dict[str, list] | None:
    """The logprobs of output tokens start..end-1 (a stream's chunk; a whole reply: all);
    None where not asked or none."""
    if shown.logprobs is None or not shown.output or start >= end:
        return None
    ids, entries = request.output_ids[start:end], request.logprobs[start:end]
    if chat:
        return chat_part(Pieces(tokenizer), ids, entries, shown.logprobs)
    return completion_part(Pieces(tokenizer), ids, entries, 0)


def whole_logprobs(
    request: Request, tokenizer: Tokenizer, shown: Shown, chat: bool
) -> dict[str, list] | None:
    """A whole reply's logprobs: the prompt's where echoed, then the output's."""
    if shown.logprobs is None:
        return None
    if chat or not shown.echo:
        return output_logprobs(request, tokenizer, shown, chat, 0, len(request.output_ids))
    pieces = Pieces(tokenizer)
    scored = [None, *(request.prompt_logprobs or ())]
    part = completion_part(pieces, request.prompt_ids, scored, 0)
    if shown.output:
        offset = len(request.prompt)
        more = completion_part(pieces, request.output_ids, request.logprobs, offset)
        for key, values in more.items():
            part[key] += values
    return part
