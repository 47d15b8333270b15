"""The trace workload: a trace file's rows become requests with the trace's arrivals (shifted,
windowed, scaled) and lengths."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from stages.interfaces import Tokenizer
from stages.scheduling.request import Request, SamplingParams
from stages.trace.csv_traces import read_csv_trace
from stages.trace.fields import collector_paused
from stages.trace.formats import FORMAT_LIST, FORMATS, TraceFormat, resolve_format
from stages.trace.mooncake import read_mooncake
from stages.trace.prompt_ids import PromptIdSource, SeededPromptIds, prompt_vocab
from stages.trace.sharegpt import read_sharegpt
from stages.workload import closed_loop, poisson_arrivals

log = structlog.get_logger(__name__)

# Shared by every trace request: none has its own sampling values or stop strings, and a
# million requests should not each carry an empty copy. The tuple cannot be appended to.
NO_SAMPLING = SamplingParams()
NO_STOP: Any = ()
# The scheduler refuses an empty prompt string; a token-count row has ids but no text. One
# shared placeholder: the request's id names the row and prompt_tokens its length.
PLACEHOLDER_PROMPT = "<seeded token ids>"


class TooLong(enum.StrEnum):
    """What a trace's prompt longer than max_model_len - 1 gets (workload.too_long)."""

    CLIP = "clip"  # its first tokens, counted as clipped
    ERROR = "error"  # refused with an error naming the limit, counted as rejected


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
    if too_long not in set(TooLong):
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
        format: str,
        model_filter: str,
        trace_block_size: int,
        time_scale: float,
        start_s: float,
        duration_s: float,
        num_requests: int,
        rate: float,
        too_long: str,
        seed: int,
        max_model_len: int,
        max_num_seqs: int,
        concurrency: int,
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
        self.too_long = TooLong(too_long)
        self.seed = seed
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.counts: dict[str, Any] = {"format": self.format, **dict.fromkeys(COUNT_KEYS, 0)}
        with collector_paused():
            try:
                if self.format is TraceFormat.SHAREGPT:
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
        if model_filter and self.format is not TraceFormat.BURSTGPT:
            raise ValueError(
                f"workload.model_filter applies to burstgpt traces; {self.path.name} is "
                f"{self.format}: drop workload.model_filter"
            )
        if self.format is TraceFormat.SHAREGPT and (time_scale != 1.0 or start_s or duration_s):
            raise ValueError(
                "a sharegpt file has no timestamps: drop workload.time_scale, start_s and "
                "duration_s, and give workload.rate (Poisson arrivals) and num_requests"
            )
        if self.format is not TraceFormat.SHAREGPT and rate:
            raise ValueError(
                f"a {self.format} trace has its own arrivals: drop workload.rate "
                "(workload.time_scale speeds them up or slows them down)"
            )

    def _read_rows(self) -> None:
        if self.format is TraceFormat.MOONCAKE:
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
            if self.format is TraceFormat.SHAREGPT:
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
            if self.too_long is TooLong.ERROR:
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
