"""Public serving traces as workloads: Azure LLM inference, BurstGPT, Mooncake, ShareGPT and
Vidur files become requests with the trace's arrivals and lengths.

Token-count traces carry lengths, not text, so a row's prompt ids are drawn from `seed` when
the request is first used (at admission), not at load: a million-row trace costs its
Request objects, never its prompt tokens (`SeededPromptIds`).
"""

from __future__ import annotations

import csv
import functools
import gc
import hashlib
import io
import json
import re
import struct
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from stages.interfaces import Tokenizer
from stages.request import PromptIds, Request, SamplingParams
from stages.workload import closed_loop, poisson_arrivals

log = structlog.get_logger(__name__)

FORMATS = {
    "azure": "CSV TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "CSV Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "mooncake": "JSONL timestamp,input_length,output_length,hash_ids",
    "sharegpt": "JSON list of {id, conversations: [{from, value}]}",
    "vidur": "CSV arrived_at,num_prefill_tokens,num_decode_tokens",
}
FORMAT_LIST = "; ".join(f"{name} ({what})" for name, what in FORMATS.items())

# CSV formats: the columns read, as (arrival, prompt tokens, output tokens), and the model's.
CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
}
BURSTGPT_MODEL = "Model"
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")

# Shared by every trace request: none has its own sampling values or stop strings, and a
# million requests should not each carry an empty copy. The tuple cannot be appended to.
NO_SAMPLING = SamplingParams()
NO_STOP: Any = ()
# The scheduler refuses an empty prompt string; a token-count row has ids but no text. One
# shared placeholder: the request's id names the row and prompt_tokens its length.
PLACEHOLDER_PROMPT = "<seeded token ids>"


# -- lazy prompt ids -------------------------------------------------------------------------
class PromptIdSource:
    """Draws prompt ids for SeededPromptIds, and keeps those of the most recently used
    `capacity` prompts, which covers every running request: the others are dropped and drawn
    again, identically, if used again."""

    def __init__(self, vocab: np.ndarray, seed: int, block_size: int, capacity: int) -> None:
        self.vocab = vocab  # the ids a prompt may hold: the vocabulary without special ids
        self.seed = seed
        self.block_size = block_size
        self.capacity = capacity
        self._cache: OrderedDict[int, SeededPromptIds] = OrderedDict()
        # What a row's stream depends on besides its line: equal tags, equal streams.
        self.tag = hashlib.blake2b(
            np.int64(seed).tobytes() + np.asarray(vocab, np.int64).tobytes(), digest_size=8
        ).digest()

    def ids(self, prompt: SeededPromptIds) -> list[int]:
        array = self.array(prompt)
        if prompt._ids is None:
            prompt._ids = array.tolist()
        return prompt._ids

    def array(self, prompt: SeededPromptIds) -> np.ndarray:
        """The prompt's ids as drawn (an array; `ids` makes the list only when asked)."""
        if prompt._array is not None:
            self._cache.move_to_end(id(prompt))
            return prompt._array
        prompt._array = self.draw(prompt._key, len(prompt))
        self._cache[id(prompt)] = prompt
        while len(self._cache) > self.capacity:
            _, evicted = self._cache.popitem(last=False)
            evicted._ids = evicted._array = None
        return prompt._array

    def _stream(self, domain: int, number: int, count: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, domain, number))
        return self.vocab[rng.integers(0, len(self.vocab), count)]

    def draw(self, key: int | tuple[int, tuple[int, ...]], length: int) -> np.ndarray:
        """A row's ids from its own stream; with hash ids, block j's ids come from hash id j's
        stream, so the same id gives the same block in every row that holds it."""
        if isinstance(key, int):
            return self._stream(0, key, length)
        line, hash_ids = key
        blocks = [
            self._stream(1, h, self.block_size) for h in hash_ids[: -(-length // self.block_size)]
        ]
        covered = len(blocks) * self.block_size
        if covered < length:  # more tokens than hash ids: the rest is the row's own
            blocks.append(self._stream(0, line, length - covered))
        return np.concatenate(blocks)[:length]


class SeededPromptIds(PromptIds):
    """A prompt's token ids, known by length until used: `len()` is O(1); indexing, slicing,
    iteration and `+` draw them (once, while in use) from the shared PromptIdSource."""

    __slots__ = ("_length", "_key", "_source", "_ids", "_array")

    def __init__(
        self, length: int, key: int | tuple[int, tuple[int, ...]], source: PromptIdSource
    ) -> None:
        self._length = length
        self._key = key  # a row's line, or (line, hash ids) for a Mooncake row
        self._source = source
        self._ids: list[int] | None = None
        self._array: np.ndarray | None = None  # the ids as drawn, the list made from it

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):  # an int or a slice, as a list
        return self._source.ids(self)[index]

    def array(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The ids start..end-1 as an array, without making the list (block hashing reads
        a prompt so)."""
        return self._source.array(self)[start:end]

    def __iter__(self) -> Iterator[int]:
        return iter(self._source.ids(self))

    def __add__(self, other: Sequence[int]) -> list[int]:
        return self._source.ids(self) + list(other)

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return list(other) + self._source.ids(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SeededPromptIds | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # equal to lists, so unhashable like them

    def prefix(self, length: int) -> SeededPromptIds:
        """The first `length` ids, still undrawn: a row's stream and a block's are drawn in
        order, so a shorter draw is a prefix of a longer one."""
        return SeededPromptIds(min(length, self._length), self._key, self._source)

    def prefix_keys(self, ends: Sequence[int]) -> list[bytes] | None:
        """Names for the ids 0..end-1 of each end, made without drawing them: a row's own
        stream is fixed by its source's seed and vocabulary and its line, and a shorter draw
        is a longer one's start, so equal names mean equal ids. None for a Mooncake row,
        whose blocks are shared through hash ids and so are known by their content."""
        if not isinstance(self._key, int):
            return None
        if ends and not 0 < min(ends) <= max(ends) <= self._length:
            raise ValueError(f"prefix_keys from {min(ends)} to {max(ends)} of {self._length} ids")
        pack, tag, line = PREFIX_KEY.pack, self._source.tag, self._key
        return [pack(tag, line, end) for end in ends]

    def __repr__(self) -> str:
        return f"SeededPromptIds(length={self._length}, key={self._key!r})"


# A drawn prompt's prefix name: its source's tag, the row's line and the prefix's length.
# 24 bytes, so never equal to a content hash (stages.kv_cache.chain_hash's are 16).
PREFIX_KEY = struct.Struct("<8sqq")


def prompt_vocab(tokenizer: Tokenizer) -> np.ndarray:
    """The ids a drawn prompt may hold: the tokenizer's vocabulary without its special ids."""
    special = {tokenizer.bos_id, tokenizer.pad_id} | tokenizer.eos_ids | tokenizer.special_ids
    vocab = np.setdiff1d(
        np.arange(tokenizer.vocab_size, dtype=np.int64),
        np.array([i for i in special if i is not None], dtype=np.int64),
    )
    if len(vocab) == 0:
        raise ValueError("the tokenizer has no ids besides its special ones to draw prompts from")
    return vocab


# A byte that is not UTF-8, as read with errors="surrogateescape": that row's error.
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
NOT_UTF8 = "not valid UTF-8 text"
MAX_COUNT = 1 << 31  # tokens in one prompt or output: beyond any model's context
MAX_FIRST_LINE = 16 << 20


# -- format detection ------------------------------------------------------------------------
def _first_line(path: Path) -> str:
    """The first non-blank line, whole up to MAX_FIRST_LINE (a Mooncake line lists every
    prefix block's hash: a long prompt's is hundreds of kilobytes)."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(65536)
        while head.strip() and "\n" not in head.lstrip() and len(head) < MAX_FIRST_LINE:
            more = f.read(1 << 20)
            if not more:
                break
            head += more
    stripped = head.lstrip()
    return stripped.splitlines()[0] if stripped else ""


def detect_format(path: Path) -> str | None:
    """The format a file's CSV header or first JSON line/character names, or None."""
    first = _first_line(path)
    if first.startswith("["):
        return "sharegpt"
    if first.startswith("{"):
        try:
            line = json.loads(first)
        except ValueError:
            return None
        return "mooncake" if isinstance(line, dict) and set(MOONCAKE_KEYS) <= set(line) else None
    names = {name.strip() for name in next(csv.reader([first]), [])}
    for name, columns in CSV_COLUMNS.items():
        if set(columns) <= names and (name != "burstgpt" or BURSTGPT_MODEL in names):
            return name
    return None


def resolve_format(path: Path, format: str) -> str:
    """The format to read `path` as; a file of no known format, or of another format than the
    one asked for, gets one line naming the formats."""
    detected = detect_format(path)
    if format == "auto" and detected:
        return detected
    if format == detected:
        return format
    snippet = _first_line(path)[:80]
    if detected:
        return _raise(
            f"workload.path={path} looks like a {detected} trace, not {format}: set "
            f"workload.format={detected} or auto"
        )
    asked = "a trace this reads" if format == "auto" else f"a {format} trace"
    return _raise(
        f"workload.path={path} is not {asked} (it begins {snippet!r}); workload.format "
        f"reads {FORMAT_LIST}"
    )


def _raise(message: str) -> str:
    raise ValueError(message)


# -- field parsing ---------------------------------------------------------------------------
_EPOCH = datetime(1970, 1, 1)
_DATETIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?")


@functools.lru_cache(maxsize=4096)
def _whole_seconds(text: str) -> float:
    # Rows of a trace share their whole second, so most parses are a cache hit.
    return (datetime.fromisoformat(text) - _EPOCH).total_seconds()


def datetime_seconds(text: str) -> float:
    """Seconds since 1970 of a date-time like `2023-11-16 18:15:46.6805900` (any number of
    fractional digits, which Python 3.10's fromisoformat refuses; an optional UTC offset)."""
    match = _DATETIME.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a date-time like 2023-11-16 18:15:46.6805900")
    seconds = _whole_seconds(match[1].replace("T", " "))
    if match[2]:
        seconds += float(match[2])
    zone = match[3]
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        hours, minutes = int(zone[1:3]), int(zone[-2:])
        if hours > 23 or minutes > 59:  # no place is a day or more from UTC
            raise ValueError(f"{text!r} has the UTC offset {zone}, which no place has")
        seconds -= sign * (hours * 3600 + minutes * 60)
    return seconds


def _time(parse: Any, text: str, name: str) -> float:
    try:
        return parse(text)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not np.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number of seconds")
    return value


def _count(value: Any, name: str, minimum: int) -> int:
    """A token count from a CSV string or a JSON value: a whole number >= minimum."""
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            as_float = float(value) if _is_number(value) else None
            if as_float is None or not as_float.is_integer():
                raise ValueError(f"{name}={value!r} is not a whole number") from None
            number = int(as_float)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ValueError(f"{name}={value!r} is not a whole number")
    if number < minimum:
        raise ValueError(f"{name}={number} must be >= {minimum}")
    if number > MAX_COUNT:
        raise ValueError(f"{name}={number} is more tokens than any context ({MAX_COUNT})")
    return number


def _is_number(text: str) -> bool:
    try:
        return np.isfinite(float(text))
    except ValueError:
        return False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a trace becomes objects: none of them is garbage,
    and its passes over the growing heap would cost more than the load itself (3x here)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- readers ---------------------------------------------------------------------------------
@dataclass
class TraceRows:
    """A token-count trace's kept rows as arrays. A malformed row is kept too, as inputs -1
    with its message in `errors`, and the time of the good row before it (NaN if none)."""

    lines: np.ndarray
    times: np.ndarray  # seconds
    inputs: np.ndarray
    outputs: np.ndarray
    errors: dict[int, str]  # line -> message
    counts: Counter
    hash_ids: list[tuple[int, ...]] | None = None  # Mooncake's, per row


def _forward_filled(times: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each invalid entry takes the time of the valid one before it, NaN before the first."""
    times = np.where(valid, times, np.nan)
    last = np.maximum.accumulate(np.where(valid, np.arange(len(times)), 0))
    return times[last] if len(times) else times


def _csv_records(text: str) -> tuple[list[list[str]], Sequence[int]]:
    """The non-blank CSV records and their line numbers; a file without quotes or blank lines
    (the usual trace) takes a fast path with no per-row Python loop for the numbers."""
    if '"' not in text:
        lines = text.splitlines()
        if all(lines):
            return [line.split(",") for line in lines], range(1, len(lines) + 1)
    reader = csv.reader(io.StringIO(text, newline=""))
    records, numbers = [], []
    for record in reader:
        if record:
            records.append(record)
            numbers.append(reader.line_num)
    return records, numbers


def _column(values: list[str], bulk: Any, one: Any) -> tuple[np.ndarray, dict[int, str]]:
    """A column converted in one numpy call, or, when a value is bad, value by value with
    each bad one's message."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's deprecated time-zone parse: go one by one
            return bulk(values), {}
    except (ValueError, TypeError, OverflowError, Warning):
        out, errors = np.zeros(len(values)), {}
        for i, value in enumerate(values):
            try:
                out[i] = one(value)
            except ValueError as err:
                errors[i] = str(err)
        return out, errors


def _count_column(values: list[str], name: str, minimum: int) -> tuple[np.ndarray, dict]:
    counts, errors = _column(
        values, lambda v: np.array(v).astype(np.int64), lambda v: _count(v, name, minimum)
    )
    counts = counts.astype(np.int64)
    for i in np.flatnonzero(counts < minimum).tolist():
        errors.setdefault(i, f"{name}={counts[i]} must be >= {minimum}")
    for i in np.flatnonzero(counts > MAX_COUNT).tolist():
        errors.setdefault(i, f"{name}={counts[i]} is more tokens than any context ({MAX_COUNT})")
    return counts, errors


def _time_column(values: list[str], format: str, name: str) -> tuple[np.ndarray, dict]:
    bulk: Callable[[list[str]], np.ndarray]
    if format == "azure":
        bulk = _bulk_datetimes
        one = datetime_seconds
    else:
        bulk = lambda v: np.array(v).astype(np.float64)  # noqa: E731
        one = _seconds
    times, errors = _column(values, bulk, one)
    for i in np.flatnonzero(~np.isfinite(times)).tolist():
        errors.setdefault(i, f"{values[i]!r} is not a finite time")
    return times, {i: f"{name}: {message}" for i, message in errors.items()}


def _bulk_datetimes(values: list[str]) -> np.ndarray:
    stamps = np.array(values, dtype="datetime64[ns]")
    seconds = stamps.astype(np.int64) / 1e9
    return np.where(np.isnat(stamps), np.nan, seconds)


def read_csv_trace(path: Path, format: str, model_filter: str = "") -> TraceRows:
    """Azure, BurstGPT or Vidur rows; BurstGPT rows of 0 response tokens are failed requests,
    skipped and counted, and `model_filter` keeps one model's rows."""
    text = path.read_text(encoding="utf-8-sig", errors="surrogateescape")
    records, numbers = _csv_records(text)
    header = [name.strip() for name in records[0]]
    records, lines = records[1:], np.asarray(numbers[1:], dtype=np.int64)
    counts: Counter = Counter(rows=len(records))
    errors = {
        i: f"{len(r)} fields, the header has {len(header)}"
        for i, r in enumerate(records)
        if len(r) != len(header)
    }
    if _NOT_UTF8.search(text):  # rare: only then is every row searched
        for i, record in enumerate(records):
            if any(_NOT_UTF8.search(field) for field in record):
                errors[i] = NOT_UTF8
    t_name, in_name, out_name = CSV_COLUMNS[format]
    if errors:  # the columns below are read from full rows only: put blanks in the others
        records = [r if len(r) == len(header) else [""] * len(header) for r in records]
    keep = np.ones(len(records), dtype=bool)
    if format == "burstgpt" and model_filter:
        c_model = header.index(BURSTGPT_MODEL)
        keep = np.array([r[c_model] == model_filter for r in records], dtype=bool)
        keep[list(errors)] = True  # a malformed row is reported whatever its model
        counts["other_model_skipped"] = int((~keep).sum())
    columns = [[r[header.index(name)] for r in records] for name in CSV_COLUMNS[format]]
    times, time_errors = _time_column(columns[0], format, t_name)
    inputs, in_errors = _count_column(columns[1], in_name, 1)
    outputs, out_errors = _count_column(columns[2], out_name, 0)
    for found in (time_errors, in_errors, out_errors):
        for i, message in found.items():
            if keep[i]:  # another model's row is skipped, however its numbers read
                errors.setdefault(i, message)
    valid = np.ones(len(records), dtype=bool)
    valid[list(errors)] = False
    if format == "burstgpt":
        failed = valid & keep & (outputs == 0)
        counts["failed_skipped"] = int(failed.sum())
        keep &= ~failed
    counts["malformed"] = len(errors)
    inputs = np.where(valid, inputs, -1)
    times = _forward_filled(times, valid & keep)
    return TraceRows(
        lines=lines[keep],
        times=times[keep],
        inputs=inputs[keep],
        outputs=outputs[keep],
        errors={int(lines[i]): message for i, message in errors.items()},
        counts=counts,
    )


def _mooncake_entry(raw: str) -> tuple[float, int, int, tuple[int, ...]]:
    entry = json.loads(raw)
    if not isinstance(entry, dict):
        raise ValueError("a line must be a JSON object")
    missing = [k for k in (*MOONCAKE_KEYS, "hash_ids") if k not in entry]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    stamp = entry["timestamp"]
    if not isinstance(stamp, int | float) or isinstance(stamp, bool) or not np.isfinite(stamp):
        raise ValueError(f"timestamp={stamp!r} is not a number of ms")
    n_in = _count(entry["input_length"], "input_length", 1)
    n_out = _count(entry["output_length"], "output_length", 0)
    hashes = entry["hash_ids"]
    if not isinstance(hashes, list):
        raise ValueError("hash_ids must be a list of whole numbers >= 0")
    return stamp / 1000.0, n_in, n_out, tuple(_count(h, "hash_ids entry", 0) for h in hashes)


def read_mooncake(path: Path) -> TraceRows:
    """Mooncake JSONL rows: timestamp in ms, lengths, and the prefix blocks' hash ids."""
    lines: list[int] = []
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hash_ids: list[tuple[int, ...]] = []
    errors: dict[int, str] = {}
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                if _NOT_UTF8.search(raw):
                    raise ValueError(NOT_UTF8)
                row = _mooncake_entry(raw)
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                errors[line] = str(err)
                row = (np.nan, -1, 0, ())
            lines.append(line)
            columns: tuple[list[Any], ...] = (times, inputs, outputs, hash_ids)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
    inputs_array = np.array(inputs, dtype=np.int64)
    return TraceRows(
        lines=np.array(lines, dtype=np.int64),
        times=_forward_filled(np.array(times, dtype=np.float64), inputs_array >= 0),
        inputs=inputs_array,
        outputs=np.array(outputs, dtype=np.int64),
        errors=errors,
        counts=Counter(rows=len(lines), malformed=len(errors)),
        hash_ids=hash_ids,
    )


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
    if _NOT_UTF8.search(prompt) or _NOT_UTF8.search(reply):
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
            f"workload.path={path} is not a JSON list: sharegpt is {FORMATS['sharegpt']}"
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


# -- the workload ----------------------------------------------------------------------------
COUNT_KEYS = (
    "rows", "requests", "malformed", "failed_skipped", "other_model_skipped",
    "unpaired_skipped", "outside_window", "past_num_requests", "clipped", "rejected",
)  # fmt: skip


def _trace_path(path: str) -> Path:
    if not path:
        raise ValueError("workload.path is required with workload=trace: set workload.path=FILE")
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"workload.path={path} is not a file")
    return file


def _check_values(
    format: str, too_long: str, time_scale: float, start_s: float, duration_s: float,
    num_requests: int, rate: float,
) -> None:  # fmt: skip
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"workload.format={format}: choose auto or one of {FORMAT_LIST}")
    if too_long not in ("clip", "error"):
        raise ValueError(f"workload.too_long={too_long}: choose workload.too_long=clip or error")
    if time_scale <= 0 or start_s < 0 or duration_s < 0 or num_requests < 0 or rate < 0:
        raise ValueError(
            "workload.time_scale must be > 0, and workload.start_s, duration_s, "
            "num_requests and rate >= 0"
        )


class TraceWorkload:
    """The requests of a serving trace file, with its arrivals (shifted so the first is 0,
    windowed, scaled) and lengths; a token-count row's prompt ids are seeded and drawn at
    admission, and every request ignores EOS so its output length is the trace's.

    `counts` (rows read, skipped, clipped, rejected, malformed, ...) is logged at load."""

    def __init__(
        self,
        path: str,
        format: str = "auto",
        model_filter: str = "",
        trace_block_size: int = 512,
        time_scale: float = 1.0,
        start_s: float = 0.0,
        duration_s: float = 0.0,
        num_requests: int = 0,
        rate: float = 0.0,
        too_long: str = "clip",
        seed: int = 0,
        max_model_len: int = 2048,
        max_num_seqs: int = 32,
        concurrency: int = 0,
    ) -> None:
        self.concurrency = closed_loop(concurrency)
        self.path = _trace_path(path)
        _check_values(format, too_long, time_scale, start_s, duration_s, num_requests, rate)
        if trace_block_size < 1 or max_model_len < 2 or max_num_seqs < 1:
            raise ValueError(
                "workload.trace_block_size and max_num_seqs must be >= 1, max_model_len >= 2"
            )
        try:
            self.format = resolve_format(self.path, format)
        except OSError as err:  # removed or made unreadable since the check
            raise ValueError(f"workload.path={path} cannot be read: {err.strerror or err}") from err
        self._check_keys(model_filter, time_scale, start_s, duration_s, rate)
        self.model_filter = model_filter
        self.trace_block_size = trace_block_size
        self.time_scale, self.start_s, self.duration_s = time_scale, start_s, duration_s
        self.num_requests = num_requests
        self.rate = rate
        self.too_long = too_long
        self.seed = seed
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.counts: dict[str, Any] = {"format": self.format, **dict.fromkeys(COUNT_KEYS, 0)}
        with collector_paused():
            try:
                if self.format == "sharegpt":
                    self._read_conversations()
                else:
                    self._read_rows()
            except OSError as err:  # removed or made unreadable since the format was read
                raise ValueError(
                    f"workload.path={path} cannot be read: {err.strerror or err}"
                ) from err

    def _check_keys(
        self, model_filter: str, time_scale: float, start_s: float, duration_s: float, rate: float
    ) -> None:
        """Keys that mean nothing for this file's format are refused, not ignored."""
        if model_filter and self.format != "burstgpt":
            raise ValueError(
                f"workload.model_filter applies to burstgpt traces; {self.path.name} is "
                f"{self.format}: drop workload.model_filter"
            )
        if self.format == "sharegpt" and (time_scale != 1.0 or start_s or duration_s):
            raise ValueError(
                "a sharegpt file has no timestamps: drop workload.time_scale, start_s and "
                "duration_s, and give workload.rate (Poisson arrivals) and num_requests"
            )
        if self.format != "sharegpt" and rate:
            raise ValueError(
                f"a {self.format} trace has its own arrivals: drop workload.rate "
                "(workload.time_scale speeds them up or slows them down)"
            )

    def _read_rows(self) -> None:
        if self.format == "mooncake":
            rows = read_mooncake(self.path)
        else:
            rows = read_csv_trace(self.path, self.format, self.model_filter)
        self.counts.update(rows.counts)
        if not rows.counts["rows"]:
            raise ValueError(f"workload.path={self.path} has no rows: give a trace with requests")
        times, valid = rows.times, rows.inputs >= 0
        origin = times[valid].min() if valid.any() else 0.0
        # A malformed row before the first good one has no time to borrow: it takes the first.
        shifted = np.where(np.isnan(times), origin, times) - origin
        window = shifted >= self.start_s
        if self.duration_s:
            window &= shifted < self.start_s + self.duration_s
        selected = np.flatnonzero(window)
        self.counts["outside_window"] = len(shifted) - len(selected)
        if self.num_requests:
            self.counts["past_num_requests"] = max(0, len(selected) - self.num_requests)
            selected = selected[: self.num_requests]
        if len(selected) == 0:
            span = f"0-{shifted.max():.1f} s" if len(shifted) else "no rows"
            raise ValueError(
                f"workload.path={self.path} gives no request ({self._count_text()}; the trace "
                f"spans {span} after the shift): change workload.start_s, duration_s or "
                "model_filter"
            )
        self._rows = rows
        self._selected = selected
        self._arrivals = (shifted[selected] - self.start_s) * self.time_scale

    def _read_conversations(self) -> None:
        conversations, counts = read_sharegpt(self.path)
        self.counts.update(counts)
        if not counts["rows"]:
            raise ValueError(f"workload.path={self.path} is an empty list: give entries")
        if self.num_requests:
            self.counts["past_num_requests"] = max(0, len(conversations) - self.num_requests)
            conversations = conversations[: self.num_requests]
        if not conversations:
            raise ValueError(
                f"workload.path={self.path} gives no request ({self._count_text()}): an entry "
                "needs a human turn followed by a gpt turn"
            )
        self._conversations = conversations

    def _count_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.counts.items() if k != "format" and v)

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        with collector_paused():
            if self.format == "sharegpt":
                requests = self._conversation_requests(tokenizer)
            else:
                requests = self._row_requests(tokenizer)
        self.counts["requests"] = len(requests)
        log.info("trace_loaded", path=str(self.path), **self.counts)
        return requests

    def _request(
        self, index: int, rid: str, line: int, prompt: str, ids: Sequence[int], n_out: int,
        arrival: float, error: str | None = None,
    ) -> Request:  # fmt: skip
        """A trace request; a prompt over max_model_len - 1 tokens is clipped or rejected, and
        an error (a malformed row's) ends the request at its arrival."""
        limit = self.max_model_len - 1
        if error is None and len(ids) > limit:
            if self.too_long == "error":
                self.counts["rejected"] += 1
                error = (
                    f"prompt has {len(ids)} tokens, max_model_len={self.max_model_len} leaves "
                    f"room for {limit} and one output token: raise max_model_len or set "
                    "workload.too_long=clip"
                )
            else:
                self.counts["clipped"] += 1
                ids = ids.prefix(limit) if isinstance(ids, SeededPromptIds) else ids[:limit]
        request = Request(
            id=rid,
            index=index,
            prompt=prompt,
            prompt_ids=ids,
            max_new_tokens=n_out,
            arrival_s=arrival,
            ignore_eos=True,
            stop=NO_STOP,
            sampling=NO_SAMPLING,
        )
        if error is not None:
            request.fail(f"{self.path.name} line {line}: {error}", arrival)
        return request

    def _row_requests(self, tokenizer: Tokenizer) -> list[Request]:
        rows, selected = self._rows, self._selected
        source = PromptIdSource(
            prompt_vocab(tokenizer), self.seed, self.trace_block_size, 2 * self.max_num_seqs
        )
        lines = rows.lines[selected].tolist()
        inputs = rows.inputs[selected].tolist()
        outputs = rows.outputs[selected].tolist()
        hash_ids = rows.hash_ids
        keys = (
            lines
            if hash_ids is None
            else [(ln, hash_ids[j]) for ln, j in zip(lines, selected, strict=True)]
        )
        request, placeholder, errors = self._request, PLACEHOLDER_PROMPT, rows.errors
        return [
            request(
                i,
                f"line-{line}",
                line,
                placeholder,
                SeededPromptIds(n_in, key, source),
                n_out,
                arrival,
            )  # fmt: skip
            if n_in >= 0
            else request(i, f"line-{line}", line, placeholder, [], 0, arrival, errors[line])
            for i, (line, key, n_in, n_out, arrival) in enumerate(
                zip(lines, keys, inputs, outputs, self._arrivals.tolist(), strict=True)
            )
        ]

    def _conversation_requests(self, tokenizer: Tokenizer) -> list[Request]:
        conversations = self._conversations
        arrivals = poisson_arrivals(len(conversations), self.rate, np.random.default_rng(self.seed))
        requests: list[Request] = []
        seen: set[str] = set()
        for i, (conv, arrival) in enumerate(zip(conversations, arrivals, strict=True)):
            # An entry's own id names it, unless another entry had it already; entries that
            # share a line (a file on one line) are told apart by their number on it.
            rid = conv.id if conv.id and conv.id not in seen else f"line-{conv.line}"
            number = 1
            while rid in seen:
                number += 1
                rid = f"line-{conv.line}.{number}"
            seen.add(rid)
            if conv.error:
                requests.append(
                    self._request(i, rid, conv.line, PLACEHOLDER_PROMPT, [], 0, arrival, conv.error)
                )
                continue
            ids = tokenizer.encode(conv.prompt)
            n_out = len(tokenizer.encode(conv.reply))  # as vLLM's serving benchmark counts it
            # A clipped prompt's text stays the trace's; prompt_tokens shows the cut.
            requests.append(self._request(i, rid, conv.line, conv.prompt, ids, n_out, arrival))
        return requests
