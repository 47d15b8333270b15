"""A chat request's messages as one prompt: the tokenizer's template, or the plain one.

The plain template (for tokenizers that carry none, such as the byte tokenizer) writes each
message as `<|role|>\\n` followed by its content and a newline, then `<|assistant|>\\n` for
the reply to follow:

    <|system|>
    You are terse.
    <|user|>
    Hi
    <|assistant|>
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def render_chat(messages: Sequence[Mapping[str, Any]], template: str | None) -> str:
    """The prompt for `messages` (each with `role` and `content`): `template` (Jinja, as
    Hugging Face tokenizers carry it) with a generation prompt, or the plain template."""
    if template is None:
        turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return turns + "<|assistant|>\n"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template).render(
            messages=list(messages), add_generation_prompt=True, bos_token="", eos_token=""
        )
    except jinja2.TemplateError as err:
        raise ValueError(f"the chat template cannot render these messages: {err}") from err


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
