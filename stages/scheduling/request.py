"""A request's state as it moves through the pipeline, and the plan of one engine step."""

from __future__ import annotations

import abc
import enum
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from stages.forward.step_shape import StepShape

# Every request gets its own sequence number: stages key their state by it, never by the
# user's id, which two lines of a file may share.
_seq_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Why a request ended, as generations.jsonl and the server's replies write it."""

    STOP = "stop"  # an end-of-sequence id or a stop string
    LENGTH = "length"  # max_new_tokens or the model's context
    ERROR = "error"  # refused, failed or aborted: the request's `error` says why


class StepMode(enum.StrEnum):
    """What a step computes, as steps.jsonl writes it (`extend` is FastDeploy's name for a
    prefill-only step)."""

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"

    @staticmethod
    def of(prefill: bool, decode: bool) -> StepMode:
        if prefill:
            return _MIXED if decode else _EXTEND
        return _DECODE


# Read at every step: a module global is read faster than an enum's attribute (Python 3.11).
_EXTEND, _DECODE, _MIXED = StepMode.EXTEND, StepMode.DECODE, StepMode.MIXED


# The largest top_k a row takes: the sampler counts candidates in int64 arrays, and no
# vocabulary comes near 2**31 tokens (a larger k keeps the whole vocabulary, as k = vocab).
TOP_K_MAX = 2**31 - 1


@dataclass
class SamplingParams:
    """Per-request sampling values; None means "use the sampler's own setting"."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    # Log-probabilities to report (the model's raw log-softmax): of each output token with
    # its `logprobs` most likely alternatives, and of each prompt token after the first
    # with its `prompt_logprobs` most likely (None: not asked, nothing computed).
    logprobs: int | None = None
    prompt_logprobs: int | None = None


class PromptIds(Sequence[int]):
    """A prompt's ids made when first used (a trace's drawn prompt, stages.trace) instead of
    held as a list; the KV-cache manager reads them through these, without making a list."""

    __slots__ = ()

    @abc.abstractmethod
    def array(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The ids start..end-1 as an array."""

    @abc.abstractmethod
    def prefix_keys(self, ends: Sequence[int]) -> list[bytes] | None:
        """A name for the ids 0..end-1 of each end, equal only for equal ids, made without
        the ids; None where the blocks are known by their content only."""


# No per-object dict: a trace may hold a million requests. Equal means the same request
# (eq=False): lists of requests are searched by identity, not by comparing every field.
@dataclass(slots=True, eq=False)
class Request:
    id: str
    index: int  # position in the workload, the order of generations.jsonl
    prompt: str
    prompt_ids: Sequence[int]  # a list, or PromptIds drawn when first used
    max_new_tokens: int
    arrival_s: float = 0.0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seq_id: int = field(default_factory=lambda: next(_seq_ids))

    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    token_times: list[float] = field(default_factory=list)  # seconds since the run's start
    finish_s: float | None = None
    num_preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    block_hashes: list[bytes] = field(default_factory=list)  # content hashes of full blocks
    logprobs: list[dict[int, float]] = field(default_factory=list)  # per output token, if asked
    # Where sampling.prompt_logprobs asks: entry i scores prompt token i + 1 (the logits of
    # position i), filled as the prefill chunks run.
    prompt_logprobs: list[dict[int, float]] | None = None
    # len(prompt_ids), read every step: a trace's ids are a sequence whose len() is a call.
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_ids)

    @property
    def all_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_token(self, token: int, now: float, logprobs: dict[int, float] | None) -> None:
        self.output_ids.append(token)
        self.token_times.append(now)
        if logprobs is not None:
            self.logprobs.append(logprobs)

    def finish(self, reason: FinishReason, now: float) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.finish_s = now

    def fail(self, message: str, now: float) -> None:
        self.finish(FinishReason.ERROR, now)
        self.error = message


@dataclass
class Samples:
    """A step's sampled tokens, one per logits row (StepPlan.sampled_requests' order)."""

    token_ids: np.ndarray  # [rows] int64
    logprobs: list[dict[int, float]] | None = None  # per row: top-k token id -> log-probability


@dataclass
class PromptSpan:
    """Prompt positions start..end-1 of a request, whose logits score its prompt tokens
    start+1..end (prompt log-probabilities), computed in this step's forward."""

    request: Request
    start: int
    end: int


@dataclass
class PrefillChunk:
    request: Request
    start: int  # first position computed by this chunk
    end: int  # one past the last
    cached: int = 0  # tokens before start taken from the prefix cache at this admission

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def is_final(self) -> bool:
        """A final chunk reaches the sequence's last token, so its sample is a real output."""
        return self.end == self.request.num_tokens

    def prompt_span(self) -> PromptSpan | None:
        """Where the request asks for prompt log-probabilities: the chunk's positions whose
        logits score a prompt token not yet scored (a recompute scores none twice)."""
        request = self.request
        if request.sampling.prompt_logprobs is None:
            return None
        scored = len(request.prompt_logprobs or ())
        start, end = max(self.start, scored), min(self.end, request.num_prompt_tokens - 1)
        return PromptSpan(request, start, end) if self.start <= scored and start < end else None


@dataclass
class StepPlan:
    """What one engine step computes: prefill chunks first, then one token per decode."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)  # ended by the scheduler this step
    # Each decode row's tokens with its new one (its computed + 1), when the scheduler has
    # them as an array already; None: read them from the requests.
    decode_lens: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.prefill) + len(self.decode)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def mode(self) -> StepMode:
        if self.prefill:
            return _MIXED if self.decode else _EXTEND
        return _DECODE

    @functools.cached_property  # the sampler and the engine both read it, once planned
    def sampled_requests(self) -> list[Request]:
        """One row of logits per entry, in the order the model returns them."""
        return [c.request for c in self.prefill] + self.decode


class HeadStep(Protocol):
    """What a run keeps of the step it starts with, as the metadata builder built it (a
    stages.forward.forward_meta.ForwardMeta): its real and padded tokens and its shape."""

    @property
    def num_tokens(self) -> int: ...

    @property
    def padded_tokens(self) -> int: ...

    @property
    def shape(self) -> StepShape: ...


@dataclass(eq=False)
class DecodeRun:
    """Decode steps of the running requests one after another, with nothing else the
    scheduler could do between them (no arrival, admission or preemption; no stop but
    the length limits): what a simulated device runs at once (stages.simulator.
    fast_forward), giving exactly what as many steps one by one give. Row i decodes in
    the first stays[i] steps, the last of which ends it, and leaves the batch; in step j
    (from 0) it attends lens[i] + j tokens.

    A run may start with the step that admitted requests (its `head`, built as any step):
    its last `joining` rows prefill their whole prompts in it and decode from the next step
    on. Each counts as a decode of its last prompt token there (lens: its prompt's tokens;
    its first output is that step's sample), in every array; what the first step runs,
    its time and its totals are the head's own."""

    requests: list[Request]  # the rows, in the scheduler's order
    lens: np.ndarray  # [rows] each row's tokens in the first step, its new one included
    stays: np.ndarray  # [rows] the steps each row decodes in, from the first
    blocks: np.ndarray  # [steps] the KV blocks each step's rows fill: sum(ceil(len / block))
    block_size: int
    # [steps] each step's decode bucket, rows and blocks, once the metadata builder padded it
    padded_rows: np.ndarray | None = None
    widths: np.ndarray | None = None
    joining: int = 0  # the last rows, which prefill in the first step (the head's)
    head: HeadStep | None = None  # the first step, where joining rows prefill in it
    # each row's decode steps until its length limit ends it, the run's length aside (None:
    # unknown; stays tell whether a row leaves)
    to_length: list[int] | None = None
    # [steps] the rows each step decodes and the KV slots it reads, where counted with the
    # blocks (None: from lens and stays when asked; a part of a run takes its share)
    batch_rows: np.ndarray | None = field(default=None, repr=False)
    batch_slots: np.ndarray | None = field(default=None, repr=False)
    _leaving: bool | None = field(default=None, init=False, repr=False)  # once asked
    steps: int = field(init=False)

    def __post_init__(self) -> None:
        self.steps = len(self.blocks)

    @property
    def rows(self) -> int:
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        """Tokens computed over the run: one per row and step it stays, the head's own."""
        decoded = int(self.stays.sum()) if self.leaving else self.rows * self.steps
        return decoded if self.head is None else decoded - self.rows + self.head.num_tokens

    @property
    def padded_tokens(self) -> int:
        """Tokens computed with their padding, once the metadata builder padded the run."""
        assert self.padded_rows is not None, "pad the run first"
        padded = int(self.padded_rows.sum())
        if self.head is None:
            return padded
        return padded - int(self.padded_rows[0]) + self.head.padded_tokens

    @property
    def leaving(self) -> bool:
        """Whether a row leaves before the last step."""
        if self._leaving is None:
            fewest = min(self.to_length) if self.to_length is not None else self.stays.min()
            self._leaving = self.steps > 0 and bool(fewest < self.steps)
        return self._leaving

    @property
    def batch(self) -> np.ndarray:
        """[steps] the rows each step decodes."""
        if self.batch_rows is None:
            self.batch_rows = self.rows - self._left_by()
        return self.batch_rows

    def _left_by(self, weights: np.ndarray | None = None) -> np.ndarray:
        """[steps] how many rows (or how much of `weights`) left before each step."""
        return np.bincount(self.stays, weights, minlength=self.steps + 1)[: self.steps].cumsum()

    def slots(self) -> np.ndarray:
        """[steps] the KV slots each step's decode attention reads: its rows' tokens."""
        if self.batch_slots is not None:
            return self.batch_slots
        steps = np.arange(self.steps, dtype=np.int64)
        total = int(self.lens.sum())
        if not self.leaving:  # the common run
            return total + self.rows * steps
        left = self._left_by(self.lens).astype(np.int64)  # sums of whole numbers: exact
        return total - left + self.batch * steps

    def first(self, steps: int) -> DecodeRun:
        """The run's first `steps` steps."""
        if steps == self.steps:
            return self
        padded, widths = self.padded_rows, self.widths
        if padded is not None and widths is not None:
            padded, widths = padded[:steps], widths[:steps]
        return self._cut(steps, padded, widths, self.head if steps else None)

    def padded(
        self, rows: np.ndarray, widths: np.ndarray, head: HeadStep | None = None
    ) -> DecodeRun:
        """The run's first len(rows) steps, each padded to a bucket of `rows` rows and
        `widths` blocks (the metadata builder's), with its head step where it has one."""
        if len(rows) == self.steps:  # the common run: all of it, padded where it is
            self.padded_rows, self.widths, self.head = rows, widths, head
            return self
        return self._cut(len(rows), rows, widths, head)

    def _cut(
        self,
        steps: int,
        padded: np.ndarray | None,
        widths: np.ndarray | None,
        head: HeadStep | None,
    ) -> DecodeRun:
        """The run's first `steps` steps (fewer than it has), padded so and with `head`."""
        batch, slots = self.batch_rows, self.batch_slots
        return DecodeRun(
            self.requests, self.lens, np.minimum(self.stays, steps), self.blocks[:steps],
            self.block_size, padded, widths, self.joining if steps else 0, head, self.to_length,
            batch[:steps] if batch is not None else None,
            slots[:steps] if slots is not None else None,
        )  # fmt: skip
