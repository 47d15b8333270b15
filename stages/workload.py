"""Workloads: the requests a run serves, with their arrival times."""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from stages.interfaces import Tokenizer
from stages.request import Request, SamplingParams

_WORDS = (
    "the block cache token prefill decode chunk budget batch shape bucket warmup step "
    "request model layer head key value query rotary norm expert graph device kernel "
    "stream queue latency throughput gaudi paddle hydra sweep review deploy serve"
).split()


def poisson_arrivals(
    count: int, rate: float, rng: np.random.Generator, start_s: float = 0.0
) -> list[float]:
    """Arrival times of a Poisson process at `rate` requests/s from `start_s`: exponential
    gaps of mean 1/rate, the first one included. All at `start_s` when rate is 0."""
    if rate <= 0:
        return [start_s] * count
    return (start_s + np.cumsum(rng.exponential(1.0 / rate, size=count))).tolist()


def closed_loop(concurrency: int) -> int:
    """`workload.concurrency`, checked: the most requests in flight, 0 for open loop."""
    if not isinstance(concurrency, int) or concurrency < 0:
        raise ValueError(
            f"workload.concurrency={concurrency}: give the most requests in flight at once "
            "(closed loop), or 0 for open-loop arrivals"
        )
    return concurrency


def prompt_of_length(tokenizer: Tokenizer, text: str, target: int) -> str:
    """The longest prefix of `text` (one character at least) that encodes to at most
    `target` tokens: exactly `target` for the byte tokenizer, within a token or two for a
    subword one. A binary search, as the token count grows with the prefix."""
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(text[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _text(rng: np.random.Generator, tokenizer: Tokenizer, target: int) -> str:
    """Seeded words encoding to `target` tokens (within a token or two for subwords)."""
    words = rng.choice(_WORDS, size=target + 8).tolist()
    text = " ".join(words)
    while len(tokenizer.encode(text)) < target:  # a subword tokenizer merges words
        text += " " + " ".join(rng.choice(_WORDS, size=target).tolist())
    return prompt_of_length(tokenizer, text, target)


class SyntheticWorkload:
    """Seeded prompts with lengths drawn uniformly from a token range, each asking for a
    number of new tokens drawn from another, like vLLM's random dataset but readable
    (words, not random ids); Poisson arrivals at `rate` from `start_s`. With
    `shared_prefix_tokens`, each prompt starts with one of `num_prefixes` shared prefixes of
    that length (a system prompt), request i with prefix i mod num_prefixes."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(
        self,
        num_requests: int,
        min_prompt_tokens: int,
        max_prompt_tokens: int,
        min_new_tokens: int,
        max_new_tokens: int,
        ignore_eos: bool,
        rate: float,
        start_s: float,
        seed: int,
        shared_prefix_tokens: int,
        num_prefixes: int,
        concurrency: int,
    ) -> None:
        self.concurrency = closed_loop(concurrency)
        if shared_prefix_tokens < 0 or num_prefixes < 1:
            raise ValueError(
                "workload.shared_prefix_tokens must be >= 0 (0 = none) and "
                "workload.num_prefixes >= 1"
            )
        if not 1 <= min_prompt_tokens <= max_prompt_tokens:
            raise ValueError(
                "workload.min_prompt_tokens must be >= 1 and <= workload.max_prompt_tokens"
            )
        if not 1 <= min_new_tokens <= max_new_tokens:
            raise ValueError("workload.min_new_tokens must be >= 1 and <= workload.max_new_tokens")
        if num_requests < 1 or rate < 0 or start_s < 0:
            raise ValueError(
                "workload.num_requests must be >= 1, workload.rate >= 0 and workload.start_s >= 0"
            )
        self.num_requests = num_requests
        self.prompt_range = (min_prompt_tokens, max_prompt_tokens)
        self.new_range = (min_new_tokens, max_new_tokens)
        self.ignore_eos = ignore_eos
        self.rate = rate
        self.start_s = start_s
        self.seed = seed
        self.shared_prefix_tokens = shared_prefix_tokens
        self.num_prefixes = num_prefixes

    def _prefixes(self, tokenizer: Tokenizer) -> list[str]:
        """The shared prefixes, from a stream of their own: without them, a seed gives the
        same prompts as it always has."""
        if not self.shared_prefix_tokens:
            return [""]
        rng = np.random.default_rng([self.seed, 1])
        return [
            _text(rng, tokenizer, self.shared_prefix_tokens) + " " for _ in range(self.num_prefixes)
        ]

    def load(self, tokenizer: Tokenizer, id_prefix: str = "req") -> list[Request]:
        rng = np.random.default_rng(self.seed)
        lengths = rng.integers(self.prompt_range[0], self.prompt_range[1] + 1, self.num_requests)
        new_tokens = rng.integers(self.new_range[0], self.new_range[1] + 1, self.num_requests)
        arrivals = poisson_arrivals(self.num_requests, self.rate, rng, self.start_s)
        prefixes = self._prefixes(tokenizer)
        requests = []
        for i in range(self.num_requests):
            prompt = prefixes[i % len(prefixes)] + _text(rng, tokenizer, int(lengths[i]))
            requests.append(
                Request(
                    id=f"{id_prefix}-{i}",
                    index=i,
                    prompt=prompt,
                    prompt_ids=tokenizer.encode(prompt),
                    max_new_tokens=int(new_tokens[i]),
                    arrival_s=arrivals[i],
                    ignore_eos=self.ignore_eos,
                )
            )
        return requests


class MixedWorkload:
    """Several synthetic workloads served together, each a named part with its own lengths,
    arrivals and seed; ids are `PART-i`, in the order the parts are given.

    The case chunked prefill exists for is two parts: many short prompts that decode for
    long, all at once, and long prompts that arrive while they decode."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(self, parts: Mapping[str, SyntheticWorkload], concurrency: int) -> None:
        if not parts:
            raise ValueError("workload.parts needs at least one part")
        for name, part in parts.items():
            if part.concurrency:
                raise ValueError(
                    f"workload.parts.{name}.concurrency: the parts share one limit; "
                    "give workload.concurrency instead"
                )
        self.parts = dict(parts)
        self.concurrency = closed_loop(concurrency)

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        requests: list[Request] = []
        for name, part in self.parts.items():
            for request in part.load(tokenizer, id_prefix=name):
                request.index = len(requests)
                requests.append(request)
        return requests


class MultiTurnWorkload:
    """Chat conversations replayed turn by turn, as from a recorded chat log: turn t's
    prompt is the conversation's system prompt, every earlier question with its recorded
    answer, and a new question, so each turn's prompt is the previous one plus its answer
    plus a question, and a prefix cache serves all but the new tail. A turn asks for as
    many new tokens as its recorded answer has (ignoring EOS) and arrives `turn_gap_s`
    after the previous one; conversations start as a Poisson process at `rate` (0: all
    at once). Ids are `convC-turnT`."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(
        self,
        num_conversations: int,
        turns: int,
        system_prompt_tokens: int,
        min_question_tokens: int,
        max_question_tokens: int,
        min_answer_tokens: int,
        max_answer_tokens: int,
        rate: float,
        turn_gap_s: float,
        seed: int,
        concurrency: int,
    ) -> None:
        self.concurrency = closed_loop(concurrency)
        if num_conversations < 1 or turns < 1 or system_prompt_tokens < 0:
            raise ValueError(
                "workload.num_conversations and workload.turns must be >= 1, "
                "workload.system_prompt_tokens >= 0"
            )
        if not 1 <= min_question_tokens <= max_question_tokens:
            raise ValueError("workload.min_question_tokens must be >= 1 and <= the max")
        if not 1 <= min_answer_tokens <= max_answer_tokens:
            raise ValueError("workload.min_answer_tokens must be >= 1 and <= the max")
        if rate < 0 or turn_gap_s < 0:
            raise ValueError("workload.rate and workload.turn_gap_s must be >= 0")
        self.num_conversations = num_conversations
        self.turns = turns
        self.system_prompt_tokens = system_prompt_tokens
        self.question_range = (min_question_tokens, max_question_tokens)
        self.answer_range = (min_answer_tokens, max_answer_tokens)
        self.rate = rate
        self.turn_gap_s = turn_gap_s
        self.seed = seed

    def _conversation(
        self, rng: np.random.Generator, tokenizer: Tokenizer, c: int, start: float
    ) -> list[Request]:
        history = (
            _text(rng, tokenizer, self.system_prompt_tokens) + "\n"
            if self.system_prompt_tokens
            else ""
        )
        turns = []
        for t in range(self.turns):
            question = _text(rng, tokenizer, int(rng.integers(*self.question_range, endpoint=True)))
            answer_tokens = int(rng.integers(*self.answer_range, endpoint=True))
            prompt = f"{history}user: {question}\nassistant:"
            turns.append(
                Request(
                    id=f"conv{c}-turn{t}",
                    index=0,
                    prompt=prompt,
                    prompt_ids=tokenizer.encode(prompt),
                    max_new_tokens=answer_tokens,
                    arrival_s=start + t * self.turn_gap_s,
                    ignore_eos=True,
                )
            )
            history = f"{prompt} {_text(rng, tokenizer, answer_tokens)}\n"
        return turns

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        rng = np.random.default_rng(self.seed)
        starts = poisson_arrivals(self.num_conversations, self.rate, rng)
        requests: list[Request] = []
        for c, start in enumerate(starts):
            for request in self._conversation(rng, tokenizer, c, start):
                request.index = len(requests)
                requests.append(request)
        return requests


# A day: later arrivals are a unit mistake (ms for s), and would idle the run for ever.
MAX_ARRIVAL_S = 86_400.0
_LINE_FIELDS = {
    "id", "prompt", "messages", "max_new_tokens", "arrival_s", "ignore_eos", "stop",
    "seed", "temperature", "top_k", "top_p",
}  # fmt: skip


def bound_arrivals(requests: Sequence[Request]) -> None:
    """The arrival rule of every workload (synthetic, multi-turn, jsonl, traces, after their
    shift and scale): a request arriving outside the first day, or at no number, ends at
    once with the reason, and the others are served, as a malformed jsonl line does."""
    for r in requests:
        if not r.finished and not 0 <= r.arrival_s <= MAX_ARRIVAL_S:  # False for NaN too
            r.fail(
                f"arrives at {r.arrival_s:.6g} s, not within the run's first day (0 to "
                f"{MAX_ARRIVAL_S:.0f} s): shorten or speed up the workload (workload."
                "duration_s, workload.time_scale, workload.rate) or fix its arrival",
                0.0,
            )


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
    line: dict[str, Any], index: int, default_new_tokens: int, arrival: float, tokenizer: Tokenizer
) -> Request:
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
    rid = line.get("id", f"line-{index + 1}")
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
    ) -> None:
        self.concurrency = closed_loop(concurrency)
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

    def _lines(self) -> list[tuple[int, bytes]]:
        """(line number, bytes) of every non-blank line, up to num_requests of them."""
        data = self.path.read_bytes()
        if data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8) :]
        lines = []
        for number, raw in enumerate(data.split(b"\n"), start=1):
            raw = raw.removesuffix(b"\r")
            if raw.strip():
                lines.append((number, raw))
                if len(lines) == self.num_requests:
                    break
        return lines

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        lines = self._lines()
        arrivals = poisson_arrivals(len(lines), self.rate, np.random.default_rng(self.seed))
        requests: list[Request] = []
        first_line_of: dict[str, int] = {}
        for index, (number, raw) in enumerate(lines):
            line: Any = None
            try:
                line = _parse_line(raw)
                request = _line_to_request(
                    line, index, self.max_new_tokens, arrivals[index], tokenizer
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
