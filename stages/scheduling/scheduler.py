"""Continuous batching under a per-step token budget, with block-aligned chunked prefill.

Each step walks the running requests first, in admission order (a decode costs one token,
an unfinished prefill continues), then admits waiting requests while the budget,
`max_num_seqs` and the KV cache allow. When the cache runs dry the most recently admitted
request is preempted by recompute.

What a prefill chunk may be and what it costs the step's budget is the chunk policy's
(stages.scheduling.chunk_policy: the padded rule, the HPU's, or the real one).

`ChunkedScheduler` splits prompts into chunks; the whole-prompt schedulers
(stages.scheduling.whole_prompt) prefill a prompt in one step or let it wait. Their runs
of decode steps done at once (a simulated device's leaps) are in
stages.scheduling.decode_runs.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections import deque

import numpy as np

from stages.scheduling.chunk_policy import Budget, ChunkPolicy, StepBudget
from stages.scheduling.decode_runs import DecodeRuns
from stages.scheduling.kv_cache import KVCacheManager, blocks_for
from stages.scheduling.limits import rejection
from stages.scheduling.request import (
    FinishReason,
    PrefillChunk,
    Request,
    Samples,
    Status,
    StepPlan,
)
from stages.scheduling.request_table import RequestTable
from stages.scheduling.step_rows import NO_ROWS, DecodeRows, StepRows, row_at
from stages.scheduling.stopping import StopRule


class RowFate(enum.Enum):
    """What a running row got at its turn in a step's walk (ChunkedScheduler._continue_one)."""

    DECODE = "decode"  # its next token
    PREFILL = "prefill"  # its next chunk
    WAITS = "waits"  # nothing: no chunk fits this step
    PREEMPTED = "preempted"  # it was preempted itself, which ends the walk


class ChunkedScheduler(DecodeRuns):
    splits_prompts = True

    def __init__(
        self,
        kv_cache: KVCacheManager,
        stop: StopRule,
        max_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        align_chunks: bool,
        long_prefill_threshold: int,
        budget: Budget | str,
        max_padding: float,
        no_evict: bool,
        max_prefill_rows: int,
        decode_tokens: int = 1,
    ) -> None:
        """decode_tokens: what one decode row costs the step's budget (1; a speculative
        verification's k + 1, as vLLM and FastDeploy count it)."""
        if decode_tokens < 1:
            raise ValueError(f"decode_tokens={decode_tokens}: a decode row costs 1 or more")
        self.decode_tokens = decode_tokens
        self.chunks = ChunkPolicy(
            kv_cache.block_size, max_tokens, Budget(budget) is Budget.padded, max_padding,
            align_chunks, long_prefill_threshold, max_prefill_rows, whole=not self.splits_prompts,
        )  # fmt: skip
        self.kv_cache = kv_cache
        self.stop = stop
        self.padded_budget = self.chunks.padded
        self.no_evict = no_evict
        self.max_tokens = max_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = kv_cache.block_size
        self.waiting: deque[Request] = deque()
        self.table = RequestTable(kv_cache, stop, max_num_seqs)  # the running requests
        self._step: StepRows | None = None  # the last plan's rows, for update

    # -- admission ---------------------------------------------------------------------------
    def rejection(self, request: Request) -> str | None:
        """Why this request can never be served under the current limits, or None."""
        return rejection(request, self.max_model_len, self.chunks, self.kv_cache)

    def add(self, request: Request) -> None:
        # Its block hashes are made when admission first looks it up, not now: a trace's
        # prompt ids are drawn only then, and a long waiting queue holds no hashes.
        request.status = Status.WAITING
        self.waiting.append(request)

    @property
    def running(self) -> list[Request]:
        """The running requests, oldest admission first: the table's rows."""
        return self.table.requests

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> StepPlan:
        plan = StepPlan()
        rows = self._step = StepRows(plan, [], [], NO_ROWS)
        budget = self.chunks.step_budget()
        self._continue_running(plan, budget, rows)
        # Like FastDeploy, nothing new is admitted in a step that had to preempt.
        if not plan.preempted:
            self._admit_waiting(plan, budget, now, rows)
        rows.decode_rows = rows.decode()
        plan.decode_lens = self.table.computed[rows.decode_rows] + 1
        return plan

    def _continue_running(self, plan: StepPlan, budget: StepBudget, rows: StepRows) -> None:
        """A decode or the next chunk for each running request, oldest first; the newest
        are preempted when the cache has no room for an older one.

        Most rows are plain decodes: one token that fits the request's last block, which
        takes nothing from the cache. Runs of them join the plan in one slice; the other
        rows go one by one. Preempting takes rows from the end and scheduling a row
        changes no other, so the rows found at the start hold for the whole walk."""
        running, cost = self.running, self.decode_tokens
        others, decodes = self.table.not_plain_decodes()
        if decodes:  # (most steps have none: every row's token fits its last block)
            others = self._take_decode_blocks(others, decodes, budget.left // cost)
        others.append(len(running))  # a sentinel: the end of the last run
        next_other = 0
        i = 0
        while i < len(running) and budget.left > 0:
            while others[next_other] < i:
                next_other += 1
            end = min(others[next_other], len(running), i + budget.left // cost)
            if end > i:
                plan.decode.extend(running[i:end])
                rows.decode_spans.append((i, end))
                budget.left -= (end - i) * cost
                i = end
                continue
            kind = self._continue_one(i, plan, budget)
            if kind is RowFate.PREEMPTED:
                return
            if kind is RowFate.DECODE:
                rows.decode_spans.append((i, i + 1))
            elif kind is RowFate.PREFILL:
                rows.prefill.append(i)
            i += 1

    def _take_decode_blocks(self, others: list[int], decodes: int, left: int) -> list[int]:
        """The decodes among the first rows that are not plain (those before any prefill
        row, within the budget `left`) take their new blocks at once, in row order, where
        the cache has them all: what the walk would do one by one. Returns the rows the
        walk still goes through one by one."""
        batch = others[: min(decodes, bisect.bisect_left(others, left))]
        if not batch or len(batch) > self.kv_cache.num_free_blocks:
            return others
        self.table.take_blocks(batch)
        return others[len(batch) :]

    def _continue_one(self, row: int, plan: StepPlan, budget: StepBudget) -> RowFate:
        """The row's decode or next chunk, if it fits: `decode`, `prefill`, `waits` (no
        chunk fits this step), or `preempted` when it was preempted itself, which ends the
        step's walk over the running requests."""
        table = self.table
        request, computed = table.requests[row], int(table.computed[row])
        remaining = request.num_tokens - computed
        is_decode = remaining == 1 and bool(request.output_ids)
        n = 1 if is_decode else self.chunks.length(remaining, budget)
        if n == 0 or (is_decode and budget.left < self.decode_tokens):
            return RowFate.WAITS
        while not table.allocate(row, n):
            last = len(table) - 1
            self._preempt(last, plan)
            if last == row:  # nothing newer was left to preempt
                return RowFate.PREEMPTED
        if is_decode:
            plan.decode.append(request)
            budget.left -= self.decode_tokens
            return RowFate.DECODE
        plan.prefill.append(PrefillChunk(request, computed, computed + n))
        self.chunks.charge(n, budget)
        return RowFate.PREFILL

    def _admit_waiting(
        self, plan: StepPlan, budget: StepBudget, now: float, rows: StepRows
    ) -> None:
        """First chunks of waiting requests, in order, while the budget, max_num_seqs and
        the cache allow; the first that does not fit ends admission (it never loops). A
        request's first chunk starts after its longest cached prefix."""
        room = self._admission_room()
        while self.waiting and budget.left > 0 and room > 0:
            request = self.waiting[0]
            cached = self.kv_cache.match_prefix(request)
            computed = len(cached) * self.block_size
            remaining = request.num_tokens - computed
            too_long = self.chunks.one_step_error(remaining)
            if too_long:  # only a preempted request gets here: its recompute outgrew a step
                self.waiting.popleft()
                request.fail(f"preempted at {too_long}: raise max_tokens or num_blocks", now)
                plan.failed.append(request)
                continue
            n = self.chunks.length(remaining, budget)
            if n == 0 or not self.kv_cache.allocate_slots(request, n, cached, computed=computed):
                return
            self.waiting.popleft()
            request.status = Status.RUNNING
            if not request.num_preemptions:
                request.cached_tokens = computed
            rows.prefill.append(len(self.table))
            self.table.append(request, computed)
            plan.prefill.append(PrefillChunk(request, computed, computed + n, computed))
            self.chunks.charge(n, budget)
            room -= 1

    def admit_computed(self, request: Request) -> bool:
        """Admits a request whose prompt was computed elsewhere (a disaggregated decode
        instance: its KV cache arrived by transfer) as running: its prompt's blocks are
        taken now. A request with no output yet has its last prompt token computed again
        by its next step, a one-token chunk that samples its first output token (vLLM's
        NixlConnector loads all but the last token's KV and recomputes that one); one that
        has output decodes its next token. False (nothing taken) while max_num_seqs or
        the cache leaves no room."""
        if len(self.running) >= self.max_num_seqs:
            return False
        if self.no_evict:  # the pool must hold it to its end beside the running requests
            total = min(request.num_prompt_tokens + request.max_new_tokens, self.max_model_len)
            free = self.kv_cache.num_free_blocks - self.table.blocks_to_come()
            if self.kv_cache.blocks_for(total) > free:
                return False
        prompt = request.num_prompt_tokens
        if not self.kv_cache.allocate_slots(request, prompt, computed=0):
            return False
        computed = prompt - (0 if request.output_ids else 1)
        request.status = Status.RUNNING
        self.kv_cache.cache_computed_blocks(request, computed)
        self.table.append(request, computed)
        return True

    def _admission_room(self) -> int:
        """How many waiting requests this step may admit: up to max_num_seqs running, and
        with `no_evict` only as many as the pool holds to their end."""
        room = self.max_num_seqs - len(self.running)
        return self._fitting_to_end(room) if self.no_evict else room

    def _fitting_to_end(self, room: int) -> int:
        """How many of the first `room` waiting requests the pool holds at their full
        length, beside the blocks the running requests will still take."""
        free = self.kv_cache.num_free_blocks - self.table.blocks_to_come()
        # Each takes a block at least: no more than free + 1 of them need looking at.
        heads = itertools.islice(self.waiting, max(min(room, free + 1), 0))
        totals = np.fromiter((r.num_prompt_tokens + r.max_new_tokens for r in heads), np.int64)
        needed = np.cumsum(blocks_for(np.minimum(totals, self.max_model_len), self.block_size))
        return int(np.searchsorted(needed, free, side="right"))

    def _preempt(self, row: int, plan: StepPlan) -> None:
        """The row's request goes back to the head of the queue, its blocks freed: it is
        recomputed later from its prompt and generated tokens."""
        victim = self.table.remove(row)
        self.kv_cache.free(victim)
        victim.status = Status.WAITING
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        plan.preempted.append(victim)

    # -- after the forward -------------------------------------------------------------------
    def update(self, plan: StepPlan, samples: Samples, now: float) -> list[Request]:
        """Advances each scheduled request and keeps its sample, unless the row ended a
        non-final chunk (that sample predicts a prompt token); returns the requests that
        finished, in row order. They finish after every row is advanced: finishing frees
        blocks, which changes nothing another row's update reads."""
        rows, table = self._step, self.table
        if rows is None or rows.plan is not plan:
            raise ValueError("update takes the plan the last schedule() returned")
        self._step = None
        ending: list[tuple[Request, FinishReason, int]] = []  # with each one's running row
        tokens = samples.token_ids.tolist()
        logprobs = samples.logprobs
        for row, (chunk, running_row) in enumerate(zip(plan.prefill, rows.prefill, strict=True)):
            request = chunk.request
            table.computed[running_row] = chunk.end
            self.kv_cache.cache_computed_blocks(request, chunk.end)  # its keys and values
            if chunk.is_final:
                entry = logprobs[row] if logprobs is not None else None
                request.append_token(tokens[row], now, entry)
                table.outputs[running_row] += 1
                reason = self.stop.reason(request)
                if reason:
                    ending.append((request, reason, running_row))
        first = len(plan.prefill)
        decode_logprobs = logprobs[first:] if logprobs is not None else None
        self._update_decodes(plan, rows.decode_rows, tokens[first:], decode_logprobs, now, ending)
        self._finish_all(ending, [now] * len(ending))
        return [request for request, _, _ in ending]

    def _update_decodes(
        self,
        plan: StepPlan,
        running_rows: DecodeRows,
        tokens: list[int],
        logprobs: list[dict[int, float]] | None,
        now: float,
        ending: list[tuple[Request, FinishReason, int]],
    ) -> None:
        """The decode rows of update, a step's rows at a time: each gets its token, and
        only the rows the arrays say may have filled a block or reached a stop are looked
        at one by one."""
        decode = plan.decode
        if len(tokens) != len(decode):
            raise ValueError(f"{len(tokens)} decode samples for {len(decode)} decode rows")
        # One pass over the requests (a step's rows are often a handful; each request is
        # visited once, with its token, its time and its count).
        for request, token in zip(decode, tokens, strict=True):
            request.output_ids.append(token)
            request.token_times.append(now)
        if logprobs is not None:
            for request, entry in zip(decode, logprobs, strict=True):
                if entry is not None:
                    request.logprobs.append(entry)
        table = self.table
        table.advance(running_rows)
        prefix, bs = self.kv_cache.prefix is not None, self.block_size
        # The rows whose token filled a block or that may stop; StopRule.reason ends none
        # of the others.
        looked_at = [(k, decode[k]) for k in table.to_look_at(running_rows, prefix)]
        if prefix and looked_at:
            computed = table.computed[running_rows]
            done = [(request, int(computed[k])) for k, request in looked_at]
            self.kv_cache.cache_computed_blocks_of([(r, c) for r, c in done if c % bs == 0])
        for k, request in looked_at:
            reason = self.stop.reason(request)
            if reason:
                ending.append((request, reason, row_at(running_rows, k)))

    def _finish_all(
        self, ending: list[tuple[Request, FinishReason, int]], times: list[float]
    ) -> None:
        """Finishes ending requests, given with their running rows, at their times, in
        order, at once: taking thousands of rows out one by one would shift the rest."""
        if not ending:
            return
        if len(ending) == 1:  # the common case: one row out
            self.table.remove(ending[0][2])
        else:
            kept = np.ones(len(self.table), dtype=bool)
            kept[[row for _, _, row in ending]] = False
            self.table.keep(kept)
        for (request, reason, _), now in zip(ending, times, strict=True):
            self._end(request, reason, now)

    def _may_admit(self, left: int) -> bool:
        """Whether a step whose decodes leave `left` of the budget could admit the first
        waiting request, now or while the running requests only decode: what holds it
        back (budget, room, a chunk that fits no step, too few free blocks) stays, except
        a cached prefix, which the decodes' full blocks may lengthen."""
        if not self.waiting or left <= 0 or self._admission_room() <= 0:
            return False
        head = self.waiting[0]
        if self.kv_cache.prefix is not None or self.chunks.one_step_error(head.num_tokens):
            return True
        n = self.chunks.length(head.num_tokens, self.chunks.step_budget(left))
        return n > 0 and self.kv_cache.blocks_for(n) <= self.kv_cache.num_free_blocks

    def abort(self, request: Request, message: str, now: float) -> None:
        """Ends a request before its stop (its client left): its blocks go back at once."""
        if request.status is Status.WAITING and request in self.waiting:
            self.waiting.remove(request)
        self.finish(request, FinishReason.ERROR, now)
        request.error = message

    def finish(self, request: Request, reason: FinishReason, now: float) -> None:
        if request.finished:
            return
        if request in self.running:
            self.table.remove(self.running.index(request))
        self._end(request, reason, now)

    def _end(self, request: Request, reason: FinishReason, now: float) -> None:
        """A request out of the running rows ends: its blocks go back, then it finishes."""
        self.kv_cache.free(request)
        request.block_hashes = []  # a finished request's hashes are never looked up again
        request.finish(reason, now)
