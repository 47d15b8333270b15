"""Continuous batching under a per-step token budget, with block-aligned chunked prefill.

Each step walks the running requests first, in admission order (a decode costs one token,
an unfinished prefill continues), then admits waiting requests while the budget,
`max_num_seqs` and the block pool allow. When the pool runs dry the most recently admitted
request is preempted by recompute.

What a prefill chunk costs is `budget`: `padded` (the HPU rule, default) charges the
tokens the device computes, since the step's prefill rows are padded to one rectangle of
whole blocks: adding a row grows it from rows x width to (rows + 1) x max(width, the
row's blocks). The budget then bounds the padded step, so the metadata builder never
meets a step larger than the budget and never has to drop or split a scheduled row.
`real` charges real tokens only (vLLM's rule); the padded step may then exceed the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stages.block_pool import BlockPool, blocks_for
from stages.request import PrefillChunk, Request, Status, StepPlan


@dataclass
class Rectangle:
    """A step's prefill rows padded to one width of whole blocks, as the HPU runs them."""

    block_size: int
    rows: int = 0
    width: int = 0
    rounded: int = 0  # the rows' own lengths rounded up to blocks: padding no layout avoids

    @property
    def area(self) -> int:
        return self.rows * self.width

    def _rounded(self, n: int) -> int:
        return blocks_for(n, self.block_size) * self.block_size

    def padding_with(self, n: int) -> float:
        """Share of the rectangle that would pad rows out to a longer neighbour's width."""
        width = max(self.width, self._rounded(n))
        return 1.0 - (self.rounded + self._rounded(n)) / ((self.rows + 1) * width)

    def add(self, n: int) -> None:
        self.rows += 1
        self.width = max(self.width, self._rounded(n))
        self.rounded += self._rounded(n)


class ChunkedScheduler:
    chunked = True

    def __init__(
        self,
        max_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        num_blocks: int,
        align_chunks: bool = True,
        long_prefill_threshold: int = 0,
        budget: str = "padded",
        max_padding: float = 0.25,
        eos_ids: Iterable[int] = (),
    ) -> None:
        if budget not in ("padded", "real"):
            raise ValueError(f"scheduler.budget={budget}: choose scheduler.budget=padded or real")
        if budget == "padded" and max_tokens < block_size:
            raise ValueError(
                f"max_tokens={max_tokens} < block_size={block_size}: with scheduler.budget=padded "
                "a prefill row costs whole blocks; raise max_tokens or lower block_size"
            )
        self.padded_budget = budget == "padded"
        if not 0.0 <= max_padding <= 1.0:
            raise ValueError(f"scheduler.max_padding={max_padding}: choose a value in [0, 1]")
        self.max_padding = max_padding
        self.max_tokens = max_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.align_chunks = align_chunks
        self.long_prefill_threshold = long_prefill_threshold
        self.eos_ids = frozenset(eos_ids)
        self.pool = BlockPool(num_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # -- admission ---------------------------------------------------------------------------
    def rejection(self, request: Request) -> str | None:
        """Why this request can never be served under the current limits, or None."""
        n = len(request.prompt_ids)
        if not request.prompt:
            return "empty prompt"
        if request.max_new_tokens < 1:
            return f"max_new_tokens={request.max_new_tokens}: must be >= 1"
        if n >= self.max_model_len:
            return (
                f"prompt has {n} tokens, max_model_len={self.max_model_len} leaves no room "
                "for output: shorten the prompt or raise max_model_len"
            )
        if not self.chunked and self._whole_cost(n) > self.max_tokens:
            return (
                f"prompt has {n} tokens ({self._whole_cost(n)} padded to whole blocks), more "
                f"than max_tokens={self.max_tokens}, and scheduler=whole never splits a prompt: "
                "raise max_tokens or use scheduler=chunked"
            )
        longest = min(n + request.max_new_tokens, self.max_model_len)
        needed = blocks_for(longest, self.block_size)
        if needed > self.pool.num_blocks:
            return (
                f"needs {needed} KV blocks of {self.block_size} tokens, the pool has "
                f"num_blocks={self.pool.num_blocks}: raise num_blocks (0 derives it)"
            )
        return None

    def _whole_cost(self, n: int) -> int:
        """Budget a whole prompt of n tokens needs on its own."""
        return blocks_for(n, self.block_size) * self.block_size if self.padded_budget else n

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------
    def _chunk_len(self, remaining: int, budget: int, rect: Rectangle) -> int:
        """Tokens of a prefill to run now; 0 means it waits for a later step.

        With the padded budget a chunk may only be as long as the rectangle it grows
        still fits, and it may not leave more than `max_padding` of the rectangle padding."""
        n = min(remaining, budget)
        if self.padded_budget:
            # A row within the current width costs that width; a wider one regrows the
            # rectangle, at most to the widest that rows + 1 rows still fit.
            widest = (budget + rect.area) // (rect.rows + 1) // self.block_size * self.block_size
            n = min(
                remaining,
                max(
                    rect.width if rect.width <= budget else 0,
                    widest if widest >= rect.width else 0,
                ),
            )
        if self.long_prefill_threshold:
            n = min(n, self.long_prefill_threshold)
        if n < remaining and self.align_chunks:
            # The HPU writes the cache in whole blocks, so a chunk that does not finish the
            # prompt must end on a block boundary; a leftover below a block waits.
            n -= n % self.block_size
        if n and rect.rows and rect.padding_with(n) > self.max_padding:
            return 0  # a short row beside a wide one: it leads a later step instead
        return n

    def _charge(self, n: int, rect: Rectangle) -> int:
        """Budget a prefill chunk of n tokens uses; grows `rect` to hold it."""
        before = rect.area
        rect.add(n)
        return rect.area - before if self.padded_budget else n

    def _blocks_needed(self, request: Request, new_tokens: int) -> int:
        total = blocks_for(request.num_computed + new_tokens, self.block_size)
        return max(0, total - len(request.block_table))

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        self.running.remove(victim)
        self.pool.release(victim.block_table)
        victim.block_table = []
        victim.num_computed = 0  # recomputed later from prompt + generated tokens
        victim.status = Status.WAITING
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        plan.preempted.append(victim)

    def schedule(self, now: float = 0.0) -> StepPlan:
        plan = StepPlan()
        budget = self.max_tokens
        rect = Rectangle(self.block_size)
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            remaining = request.num_tokens - request.num_computed
            is_decode = remaining == 1 and bool(request.output_ids)
            n = 1 if is_decode else self._chunk_len(remaining, budget, rect)
            if n == 0:
                i += 1
                continue
            needed = self._blocks_needed(request, n)
            while needed > self.pool.num_free and self.running[-1] is not request:
                self._preempt(self.running[-1], plan)
            if needed > self.pool.num_free:
                self._preempt(request, plan)
                break
            request.block_table += self.pool.allocate(needed)
            if is_decode:
                plan.decode.append(request)
                budget -= 1
            else:
                plan.prefill.append(
                    PrefillChunk(request, request.num_computed, request.num_computed + n)
                )
                budget -= self._charge(n, rect)
            i += 1

        # Like the reference, nothing new is admitted in a step that had to preempt.
        while not plan.preempted and self.waiting and budget > 0:
            if len(self.running) >= self.max_num_seqs:
                break
            request = self.waiting[0]
            remaining = request.num_tokens - request.num_computed
            if not self.chunked and self._whole_cost(remaining) > self.max_tokens:
                # Only a preempted request can get here: its recompute outgrew the budget.
                self.waiting.popleft()
                request.fail(
                    f"preempted at {remaining} tokens, more than max_tokens={self.max_tokens} "
                    "that scheduler=whole must prefill at once: raise max_tokens or num_blocks",
                    now,
                )
                plan.failed.append(request)
                continue
            n = self._chunk_len(remaining, budget, rect)
            if n == 0 or (not self.chunked and n < remaining):
                break  # the leftover budget ends admission for this step; it never loops
            needed = self._blocks_needed(request, n)
            if needed > self.pool.num_free:
                break
            self.waiting.popleft()
            request.status = Status.RUNNING
            request.block_table += self.pool.allocate(needed)
            self.running.append(request)
            plan.prefill.append(
                PrefillChunk(request, request.num_computed, request.num_computed + n)
            )
            budget -= self._charge(n, rect)
        return plan

    # -- after the forward -------------------------------------------------------------------
    def update(self, plan: StepPlan, token_ids: Sequence[int], now: float) -> list[Request]:
        """Advance each scheduled request; returns the requests whose sample was kept."""
        sampled = []
        for row, chunk in enumerate(plan.prefill):
            request = chunk.request
            final = chunk.is_final
            request.num_computed = chunk.end
            # The sample at the end of a non-final chunk predicts a prompt token: discard it.
            if final:
                self._append(request, int(token_ids[row]), now)
                sampled.append(request)
        offset = len(plan.prefill)
        for row, request in enumerate(plan.decode):
            request.num_computed += 1
            self._append(request, int(token_ids[offset + row]), now)
            sampled.append(request)
        return sampled

    def _append(self, request: Request, token: int, now: float) -> None:
        request.output_ids.append(token)
        request.token_times.append(now)
        if not request.ignore_eos and token in self.eos_ids:
            self.finish(request, "stop", now)
        elif len(request.output_ids) >= request.max_new_tokens:
            self.finish(request, "length", now)
        elif request.num_tokens >= self.max_model_len:
            self.finish(request, "length", now)

    def finish(self, request: Request, reason: str, now: float) -> None:
        if request.finished:
            return
        if request in self.running:
            self.running.remove(request)
        self.pool.release(request.block_table)
        request.block_table = []
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.finish_s = now


class WholeScheduler(ChunkedScheduler):
    """Prefills every prompt in one step: the baseline that chunked prefill is measured against."""

    chunked = False

    def __init__(self, **kwargs) -> None:
        kwargs["align_chunks"] = False
        kwargs["long_prefill_threshold"] = 0
        super().__init__(**kwargs)
