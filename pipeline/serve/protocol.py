"""The OpenAI request bodies this server takes (pydantic), and how one becomes a Request.

Bodies are validated strictly: a wrong type or an unknown field is a 400 naming the field.
Every number is bounded by BOUNDS, the range its consumer takes (the sampler's int64 top_k,
the engine's int32 token counts), and stop strings by their count and total length, so no
value that passes here can fail in the engine. Fields OpenAI defines but this engine does
not implement are accepted only at their neutral value (`n=1`, `logit_bias` absent,
penalties 0, ...): any other value is a 400 naming the field, never silently ignored.
"""

from __future__ import annotations

import enum
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.serve.logprobs import Shown
from stages.scheduling.request import TOP_K_MAX, Request, SamplingParams

INT32_MAX = 2**31 - 1
# Field -> (lowest, highest) value accepted, each the range of the stage that consumes it.
BOUNDS: dict[str, tuple[float, float]] = {
    "max_tokens": (1, INT32_MAX),  # then checked against the context (400 beyond it)
    "max_completion_tokens": (1, INT32_MAX),
    "temperature": (0.0, 1e6),  # finite: the logits are divided by it
    "top_p": (1e-9, 1.0),  # (0, 1]
    "top_k": (-1, TOP_K_MAX),  # -1 or 0: off (vLLM's convention); the sampler's int64 rows
    "seed": (-(2**63), 2**63 - 1),  # a 64-bit stream key
}
MAX_STOP_STRINGS = 16  # each is searched for at every step of the request
MAX_STOP_CHARS = 1024  # their total length

MAX_LOGPROBS = 20  # alternatives per token, OpenAI's limit

# Field -> the only values accepted (OpenAI's defaults, and what clients send by default).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "suffix": (None,),
    "tools": (None, []),
    "response_format": (None, {"type": "text"}),
}


ECHO_CHARS = 80  # of a value an error repeats back: enough to recognise it


def echoed(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as an error repeats it: its first `limit` characters and its length beyond
    (a 20,000-entry logit_bias or a 100 KB path is not sent back whole)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class RequestError(ValueError):
    """A request the server refuses with 400; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UsageMode(enum.Enum):
    """What usage a stream sends: none, once at the end, or with every chunk too."""

    NONE = "none"
    FINAL = "final"
    CONTINUOUS = "continuous"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def bounded(name: str) -> Any:
    """The field `name` of BOUNDS: absent, or within its range."""
    low, high = BOUNDS[name]
    return Field(default=None, ge=low, le=high)


B = TypeVar("B", bound=Strict)


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class GenerationBody(Strict):
    """What both routes share: sampling, stopping and streaming."""

    model: str | None = None
    max_tokens: int | None = bounded("max_tokens")
    temperature: float | None = bounded("temperature")
    top_p: float | None = bounded("top_p")
    top_k: int | None = bounded("top_k")
    seed: int | None = bounded("seed")
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for the caller's logs; nothing to do here
    # OpenAI's fields this engine does not implement: NEUTRAL values only.
    n: int | None = None
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    def check_supported(self) -> None:
        for name, allowed in NEUTRAL.items():
            if name in type(self).model_fields:
                value = getattr(self, name)
                if value not in allowed:
                    raise RequestError(
                        f"{name}={echoed(repr(value))} is not supported by this server "
                        f"(accepted: {', '.join(repr(a) for a in allowed)})",
                        name,
                    )
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options is only allowed with stream=true", "stream_options")
        options = self.stream_options
        if options and options.continuous_usage_stats and not options.include_usage:
            raise RequestError(
                "stream_options.continuous_usage_stats=true needs include_usage=true too",
                "stream_options",
            )
        check_stop(self.stop_strings)

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def usage_mode(self) -> UsageMode:
        options = self.stream_options
        if not (options and options.include_usage):
            return UsageMode.NONE
        return UsageMode.CONTINUOUS if options.continuous_usage_stats else UsageMode.FINAL

    def shown(self) -> Shown:
        """Log-probabilities and echo, as the route's own fields ask."""
        return Shown()


class CompletionBody(GenerationBody):
    # A list of one text or of one id list: lm-eval's batch of one.
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)  # 0: echo, prompt scored
    echo: bool | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        prompt = self.prompt
        batch = isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list)
        if batch and len(prompt) > 1:
            raise RequestError(
                f"one prompt per request is supported (got a list of {len(prompt)}): "
                "send each prompt in a request of its own",
                "prompt",
            )
        if self.echo and self.stream:
            raise RequestError("echo is not supported with stream=true", "echo")
        if self.max_tokens == 0 and not self.echo:
            raise RequestError("max_tokens=0 needs echo=true (the prompt scored)", "max_tokens")

    def shown(self) -> Shown:
        return Shown(self.logprobs, bool(self.echo), self.max_tokens != 0)

    def limit(self) -> int | None:
        """max_tokens; 0 runs one token (the last prompt position's logits), not shown."""
        return 1 if self.max_tokens == 0 else self.max_tokens

    def prompt_text(self) -> str | list[int]:
        """The prompt as text, or as token ids where the client sent ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            return prompt[0]
        return cast("str | list[int]", prompt)  # a text, or the ids a client sent


class ChatBody(GenerationBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = bounded("max_completion_tokens")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")

    def shown(self) -> Shown:
        return Shown(self.top_logprobs or 0) if self.logprobs else Shown()

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def check_stop(stop: list[str]) -> None:
    """Stop strings: not empty, at most MAX_STOP_STRINGS of at most MAX_STOP_CHARS in all."""
    if not all(stop):
        raise RequestError("stop strings must not be empty: remove the empty one", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(
            f"{len(stop)} stop strings, at most {MAX_STOP_STRINGS} are accepted", "stop"
        )
    total = sum(map(len, stop))
    if total > MAX_STOP_CHARS:
        raise RequestError(
            f"the stop strings have {total} characters in all, at most {MAX_STOP_CHARS} "
            "are accepted",
            "stop",
        )


def parse(body_type: type[GenerationBody], raw: bytes) -> GenerationBody:
    """The body validated, or a RequestError naming the first bad field."""
    body = parse_body(body_type, raw)
    body.check_supported()
    return body


def parse_body(body_type: type[B], raw: bytes) -> B:
    """Any strict body validated (the tokenizer routes' too), or a RequestError naming
    the first bad field."""
    try:
        body = body_type.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        param = str(first["loc"][0]) if first["loc"] else "body"
        if first["type"] == "json_invalid":
            raise RequestError(f"the body is not valid JSON: {first['msg']}", "body") from None
        if first["type"] == "extra_forbidden":
            raise RequestError(f"unknown field '{where}'", param) from None
        if first["type"] == "model_type" and not where:
            raise RequestError("the body must be a JSON object", "body") from None
        raise RequestError(f"{where or 'body'}: {first['msg']}", param) from None
    return body


def to_request(
    body: GenerationBody,
    prompt: str,
    prompt_ids: list[int],
    limit: int | None,
    max_model_len: int,
    ident: tuple[str, int],
    arrival_s: float,
) -> Request:
    """The engine's request for a validated body; without max_tokens the output may run to
    max_model_len."""
    rid, index = ident
    top_k = body.top_k if body.top_k not in (-1,) else 0
    shown = body.shown()
    return Request(
        id=rid,
        index=index,
        prompt=prompt,
        prompt_ids=prompt_ids,
        max_new_tokens=limit if limit is not None else max(1, max_model_len - len(prompt_ids)),
        arrival_s=arrival_s,
        ignore_eos=body.ignore_eos,
        stop=body.stop_strings,
        sampling=SamplingParams(
            temperature=body.temperature,
            top_k=top_k,
            top_p=body.top_p,
            seed=body.seed,
            logprobs=shown.logprobs,
            prompt_logprobs=shown.logprobs if shown.echo else None,
        ),
    )
