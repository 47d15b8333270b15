"""Chat messages to prompt text with a model's own chat template (a Jinja template, as in
Hugging Face's tokenizer_config.json and GGUF's tokenizer.chat_template), or the plain
template for tokenizers that carry none (the byte tokenizer): each message as
`<|role|>` and a newline, its content and a newline, then `<|assistant|>` and a newline.

The template is rendered in jinja2's immutable sandbox: it comes with the model file, so it
may read the values it is given but not call into Python or change them; and in a child
process with a time, memory and output limit (stages/loading/template_worker.py), so it cannot hang
or exhaust the caller either. In the plain template a message's content may not hold a role
marker (`<|user|>`, ...): it would forge a turn. The variables are
the ones transformers' apply_chat_template gives (messages, add_generation_prompt,
bos_token, eos_token) and its `raise_exception`; whitespace control is transformers' too
(trim_blocks, lstrip_blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stages.loading.template_worker import TemplateRenderer

ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: OpenAI's system
MARKERS = tuple(f"<|{role}|>" for role in ROLES)
RENDERER = TemplateRenderer()  # the process's one child for model templates


def _content(value: Any, index: int) -> str:
    """A message's content: a string, or OpenAI's list of text parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    raise ValueError(
        f"messages[{index}].content must be a string (or a list of text parts), not {value!r}"
    )


def check_messages(messages: Any) -> list[dict[str, str]]:
    """The messages as plain {role, content} dicts; ValueError names the bad one."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role={role!r}: use one of {', '.join(ROLES)}")
        checked.append({"role": role, "content": _content(message.get("content"), i)})
    return checked


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of `messages` under `template` (None: the plain one), ending where
    the assistant's answer begins (add_generation_prompt). ValueError for bad messages or
    a template that fails."""
    checked = check_messages(list(messages))
    if template is None:
        return plain_chat(checked, add_generation_prompt)
    variables = {"messages": checked, "add_generation_prompt": add_generation_prompt,
                 "bos_token": bos_token, "eos_token": eos_token}  # fmt: skip
    return RENDERER.render(template, variables)


def plain_chat(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The plain template; ValueError where a content holds a role marker."""
    for i, m in enumerate(messages):
        forged = next((marker for marker in MARKERS if marker in m["content"]), None)
        if forged:
            raise ValueError(
                f"messages[{i}].content holds '{forged}', a role marker of the plain chat "
                "template: remove it (each message is one turn)"
            )
    turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return turns + ("<|assistant|>\n" if add_generation_prompt else "")
