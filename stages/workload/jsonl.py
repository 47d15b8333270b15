"""A jsonl workload: one request per line, a bad line that request's error."""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from stages.interfaces import Tokenizer
from stages.scheduling.request import Request, SamplingParams
from stages.workload.arrivals import MAX_ARRIVAL_S, closed_loop, poisson_arrivals

_LINE_FIELDS = {
    "id", "prompt", "messages", "max_new_tokens", "arrival_s", "ignore_eos", "stop",
    "seed", "temperature", "top_k", "top_p",
}  # fmt: skip


# A bound, generous by design (assumed, not measured): a token is taken to span at most 256
# bytes of text, and JSON may write each byte as a 6-byte escape (\u00e9). A line beyond
# max_model_len x this holds more tokens than the context, whatever the tokenizer, and is
# refused before it is parsed or tokenized (a 300 MB line once cost 6 GB to tokenize).
MAX_LINE_BYTES_PER_TOKEN = 256 * 6


def _arrival(line: dict[str, Any], default: float) -> float:
    value = line.get("arrival_s", default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("'arrival_s' must be a number of seconds")
    if not 0 <= value <= MAX_ARRIVAL_S:  # False for NaN too
        raise ValueError(f"'arrival_s'={value} must be within 0 and {MAX_ARRIVAL_S:.0f} s")
    return float(value)


def _prompt(line: dict[str, Any], tokenizer: Tokenizer) -> tuple[str, list[int]]:
    """The line's prompt text and ids: `prompt` as given, or `messages` through the
    tokenizer's chat template."""
    if "prompt" in line and "messages" in line:
        raise ValueError("give 'prompt' or 'messages', not both")
    if "prompt" not in line and "messages" not in line:
        raise ValueError("'prompt' (a string) or 'messages' (a chat) is required")
    if "messages" in line:
        return tokenizer.encode_chat(line["messages"])
    prompt = line["prompt"]
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    return prompt, tokenizer.encode(prompt) if prompt else []


def _line_to_request(
    line: dict[str, Any],
    index: int,
    number: int,
    default_new_tokens: int,
    arrival: float,
    tokenizer: Tokenizer,
) -> Request:
    """The request of the line at `index` among the file's requests, `number` in the file
    (its default id: line-NUMBER, as a bad line's error names it)."""
    unknown = sorted(set(line) - _LINE_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; allowed: {sorted(_LINE_FIELDS)}")
    prompt, prompt_ids = _prompt(line, tokenizer)
    stop = line.get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise ValueError("'stop' must be a list of non-empty strings")
    max_new = line.get("max_new_tokens", default_new_tokens)
    if not isinstance(max_new, int) or isinstance(max_new, bool):
        raise ValueError("'max_new_tokens' must be an integer")
    ignore_eos = line.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ValueError(f"'ignore_eos' must be true or false (a JSON boolean), not {ignore_eos!r}")
    for key, top in (("top_k", 2**31), ("seed", 2**63)):
        value = line.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not -top < value < top:
            raise ValueError(f"'{key}'={value} is out of range: use a value below {top}")
    rid = line.get("id", f"line-{number}")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        raise ValueError("'id' must be a string or an integer")
    return Request(
        id=str(rid),
        index=index,
        prompt=prompt,
        prompt_ids=prompt_ids,
        max_new_tokens=max_new,
        arrival_s=_arrival(line, arrival),
        ignore_eos=ignore_eos,
        stop=stop,
        sampling=SamplingParams(
            temperature=line.get("temperature"),
            top_k=line.get("top_k"),
            top_p=line.get("top_p"),
            seed=line.get("seed"),
        ),
    )


def _parse_line(raw: bytes) -> dict[str, Any]:
    """One jsonl line's JSON object; ValueError says what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 (byte {err.start}: {raw[err.start : err.end]!r})") from err
    try:
        line = json.loads(text)
    except RecursionError as err:
        raise ValueError("nested too deeply to read") from err
    if not isinstance(line, dict):
        raise ValueError("a line must be a JSON object")
    return line


def _line_id(line: Any, number: int) -> str:
    """The line's own id when it has a usable one, so an error is easy to match up."""
    rid = line.get("id") if isinstance(line, dict) else None
    if isinstance(rid, str | int) and not isinstance(rid, bool) and str(rid):
        return str(rid)
    return f"line-{number}"


class JsonlWorkload:
    """One request per line of a jsonl file; a bad line becomes that request's error.

    Lines are split on "\\n" only (a prompt may hold U+2028 or a form feed), each decoded
    as UTF-8 on its own (a bad byte spoils its line, not the file); a leading byte-order
    mark and a trailing "\\r" are dropped; blank lines are skipped."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(
        self,
        path: str,
        num_requests: int,
        max_new_tokens: int,
        rate: float,
        seed: int,
        concurrency: int,
        max_model_len: int,
    ) -> None:
        self.concurrency = closed_loop(concurrency)
        # the bytes a line may have and still hold a prompt that fits max_model_len (0: no
        # bound); a longer one is refused before it is parsed or tokenized
        self.max_line_bytes = max_model_len * MAX_LINE_BYTES_PER_TOKEN
        if not path:
            raise ValueError(
                "workload.path is required with workload=jsonl: set workload.path=FILE"
            )
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ValueError(f"workload.path={path} is not a file")
        if num_requests < 0:
            raise ValueError(f"workload.num_requests={num_requests}: use 0 (every line) or more")
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"workload.rate={rate}: use 0 (all at once) or a positive rate")
        if max_new_tokens < 1:
            raise ValueError(f"workload.max_new_tokens={max_new_tokens}: must be >= 1")
        self.num_requests = num_requests  # 0 = every line
        self.max_new_tokens = max_new_tokens
        self.rate = rate
        self.seed = seed

    def _lines(self) -> list[tuple[int, bytes | int]]:
        """(line number, bytes) of every non-blank line, up to num_requests of them; a line
        longer than max_line_bytes is kept as its length alone."""
        lines: list[tuple[int, bytes | int]] = []
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if number == 1:
                    raw = raw.removeprefix(codecs.BOM_UTF8)
                raw = raw.removesuffix(b"\n").removesuffix(b"\r")
                if not raw.strip():
                    continue
                oversized = self.max_line_bytes and len(raw) > self.max_line_bytes
                lines.append((number, len(raw) if oversized else raw))
                if len(lines) == self.num_requests:
                    break
        return lines

    def _oversized(self, size: int) -> str:
        return (
            f"{size:,} bytes, more than any prompt that fits max_model_len="
            f"{self.max_line_bytes // MAX_LINE_BYTES_PER_TOKEN} can take "
            f"({self.max_line_bytes:,} bytes): shorten it or raise max_model_len"
        )

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        lines = self._lines()
        arrivals = poisson_arrivals(len(lines), self.rate, np.random.default_rng(self.seed))
        requests: list[Request] = []
        first_line_of: dict[str, int] = {}
        for index, (number, raw) in enumerate(lines):
            line: Any = None
            try:
                if isinstance(raw, int):
                    raise ValueError(self._oversized(raw))
                line = _parse_line(raw)
                request = _line_to_request(
                    line, index, number, self.max_new_tokens, arrivals[index], tokenizer
                )
                if request.id in first_line_of:
                    raise ValueError(
                        f"id {request.id!r} is already line {first_line_of[request.id]}'s: "
                        "give every line its own id"
                    )
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                rid = _line_id(line, number)
                request = Request(
                    id=rid if rid not in first_line_of else f"line-{number}",
                    index=index,
                    prompt="",
                    prompt_ids=[],
                    max_new_tokens=0,
                )
                request.fail(f"{self.path.name} line {number}: {err}", 0.0)
            first_line_of.setdefault(request.id, number)
            requests.append(request)
        return requests
