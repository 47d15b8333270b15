"""ShareGPT JSON lists: each entry's first human turn and the reply after it."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.trace.formats import FORMATS, NOT_UTF8, UNDECODED, TraceFormat


@dataclass
class Conversation:
    """A ShareGPT entry's prompt and reply, or why it cannot be served."""

    line: int
    id: str | None
    prompt: str = ""
    reply: str = ""
    error: str | None = None


def _conversation(entry: Any, line: int) -> Conversation | None:
    """The first human turn and the gpt turn after it; None when there is no such pair."""
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        return Conversation(
            line, None, error="an entry must be an object with a conversations list"
        )
    rid = entry.get("id")
    rid = str(rid) if isinstance(rid, str | int) and not isinstance(rid, bool) else None
    turns = entry["conversations"]
    for turn in turns:
        if not (isinstance(turn, dict) and isinstance(turn.get("from"), str)):
            return Conversation(line, rid, error="a turn must be an object with 'from' and 'value'")
        if not isinstance(turn.get("value"), str):
            return Conversation(line, rid, error="a turn's 'value' must be a string")
    first = next((i for i, t in enumerate(turns) if t["from"] == "human"), None)
    if first is None or first + 1 >= len(turns) or turns[first + 1]["from"] != "gpt":
        return None
    prompt, reply = turns[first]["value"], turns[first + 1]["value"]
    if UNDECODED.search(prompt) or UNDECODED.search(reply):
        return Conversation(line, None, error=NOT_UTF8)
    return Conversation(line, rid, prompt, reply) if prompt and reply else None


def read_sharegpt(path: Path) -> tuple[list[Conversation], Counter]:
    """The entries of a ShareGPT JSON list, each with the line it starts on. Bad JSON ends the
    read there: the entry that holds it is an error naming its line and saying so."""
    text = path.read_text(encoding="utf-8-sig", errors="surrogateescape")
    decoder = json.JSONDecoder()
    counts: Counter = Counter()
    conversations: list[Conversation] = []
    pos = _skip_space(text, 0)
    line, counted = 1, 0  # newlines are counted incrementally: one pass over the text
    if not text.startswith("[", pos):
        raise ValueError(
            f"workload.path={path} is not a JSON list: sharegpt is {FORMATS[TraceFormat.sharegpt]}"
        )
    pos = _skip_space(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        line += text.count("\n", counted, pos)  # the line this entry starts on
        counted = pos
        counts["rows"] += 1
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as err:  # nested beyond Python's stack, too
            counts["malformed"] += 1
            message = f"bad JSON ({err}); the entries after it are not read"
            conversations.append(Conversation(line, None, error=message))
            break
        conversation = _conversation(entry, line)
        if conversation is None:
            counts["unpaired_skipped"] += 1
        else:
            counts["malformed"] += conversation.error is not None
            conversations.append(conversation)
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_space(text, pos + 1)
    return conversations, counts


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
