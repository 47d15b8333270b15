"""The OpenAI request bodies this server takes (pydantic), and how one becomes a Request.

Bodies are validated strictly: a wrong type or an unknown field is a 400 naming the field.
Fields OpenAI defines but this engine does not implement are accepted only at their
neutral value (`n=1`, `logit_bias` absent, penalties 0, ...): any other value is a 400
naming the field, never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.serve.logprobs import Shown
from stages.request import Request, SamplingParams

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


class RequestError(ValueError):
    """A request the server refuses with 400; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


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
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # -1 or 0: off (vLLM's convention)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
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
                        f"{name}={value!r} is not supported by this server "
                        f"(accepted: {', '.join(repr(a) for a in allowed)})",
                        name,
                    )
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options is only allowed with stream=true", "stream_options")

    @property
    def stop_strings(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if not all(stop):
            raise RequestError("stop strings must not be empty", "stop")
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def shown(self) -> Shown:
        """Log-probabilities and echo, as the route's own fields ask."""
        return Shown()


class CompletionBody(GenerationBody):
    # A list of one text or of one id list: lm-eval's batch of one.
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: with echo, the prompt scored
    echo: bool | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
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
            if len(prompt) != 1:
                raise RequestError("one prompt per request is supported (got a list)", "prompt")
            return prompt[0]
        return cast("str | list[int]", prompt)  # a text, or the ids a client sent


class ChatBody(GenerationBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
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
        if first["type"] == "json_invalid":
            raise RequestError(f"the body is not valid JSON: {first['msg']}") from None
        if first["type"] == "extra_forbidden":
            raise RequestError(f"unknown field '{where}'", where) from None
        if first["type"] == "model_type" and not where:
            raise RequestError("the body must be a JSON object") from None
        raise RequestError(f"{where or 'body'}: {first['msg']}", where or None) from None
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
