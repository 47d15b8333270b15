"""Continuous batching under a per-step token budget, with block-aligned chunked prefill.

Each step walks the running requests first, in admission order (a decode costs one token,
an unfinished prefill continues), then admits waiting requests while the budget,
`max_num_seqs` and the KV cache allow. When the cache runs dry the most recently admitted
request is preempted by recompute.

What a prefill chunk may be and what it costs the step's budget is the chunk policy's
(stages.scheduling.chunk_policy: the padded rule, the HPU's, or the real one).

`ChunkedScheduler` splits prompts into chunks; the whole-prompt schedulers
(stages.scheduling.whole_prompt) prefill a prompt in one step or let it wait. A run of
decode steps planned elsewhere (a simulated device's) is applied by apply_decodes.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

import numpy as np

from stages.scheduling.admission import Admission, StepOrder
from stages.scheduling.chunk_policy import Budget, ChunkPolicy, StepBudget
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.limits import rejection
from stages.scheduling.lookahead import Lookahead
from stages.scheduling.request import (
    DecodeRun,
    FinishReason,
    PrefillChunk,
    Request,
    Samples,
    Status,
    StepPlan,
)
from stages.scheduling.request_table import RequestTable
from stages.scheduling.run_updates import Ending, apply_run
from stages.scheduling.step_rows import NO_ROWS, DecodeRows, RowFate, StepRows, row_at
from stages.scheduling.stopping import StopRule


class ChunkedScheduler:
    splits_prompts = True
    static_batches = False  # admits only into an empty table (StaticScheduler)

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
        step_order: StepOrder | str,
        decode_tokens: int = 1,
        lookahead_slots: int = 0,
        accepted_tokens: Callable[[int], int] = lambda verification: 0,
    ) -> None:
        """decode_tokens: what one decode row costs the step's budget (1; a speculative
        verification's k + 1, as vLLM and FastDeploy count it). lookahead_slots: the
        proposals a decode row verifies each step (0: no speculation), whose n-th
        verification accepts accepted_tokens(n) more tokens (stages.scheduling.lookahead).
        step_order: running rows first in a mixed step, or prefill steps of their own first
        (stages.scheduling.admission.StepOrder)."""
        if decode_tokens < 1:
            raise ValueError(f"decode_tokens={decode_tokens}: a decode row costs 1 or more")
        self.decode_tokens = decode_tokens
        self.step_order = StepOrder(step_order)
        self.lookahead = Lookahead(lookahead_slots, accepted_tokens) if lookahead_slots else None
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
        self.admission = Admission(
            self.waiting, self.table, kv_cache, self.chunks,
            (max_tokens, max_num_seqs, max_model_len), no_evict, self.step_order,
            self.static_batches,
        )  # fmt: skip
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

    def admit_computed(self, request: Request) -> bool:
        """Admits a request whose prompt was computed elsewhere (Admission.admit_computed)."""
        return self.admission.admit_computed(request)

    def may_admit(self, left: int) -> bool:
        """Whether a step leaving `left` of the budget could admit (Admission.may_admit)."""
        return self.admission.may_admit(left)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> StepPlan:
        plan = StepPlan()
        rows = self._step = StepRows(plan, [], [], NO_ROWS)
        budget = self.chunks.step_budget()
        if self.step_order is StepOrder.prefill_first and self._prefill_alone(plan, now, rows):
            return plan
        self._continue_running(plan, budget, rows)
        # Like FastDeploy, nothing new is admitted in a step that had to preempt.
        if not plan.preempted:
            self.admission.admit_waiting(plan, budget, now, rows)
        rows.decode_rows = rows.decode()
        plan.decode_lens = self.table.computed[rows.decode_rows] + 1
        if self.lookahead:  # each decode row's room for its proposals
            self.lookahead.reserve(self.table, rows.decode_rows)
        return plan

    def _prefill_alone(self, plan: StepPlan, now: float, rows: StepRows) -> bool:
        """A step of prefill chunks only, SGLang's order: the running prompts' next chunks,
        oldest first, then waiting prompts as admission allows. False where no chunk fits:
        the step decodes instead."""
        budget = self.chunks.step_budget()
        for row in range(len(self.running)):
            request = self.running[row]
            remaining = request.num_tokens - int(self.table.computed[row])
            if budget.left <= 0 or (remaining == 1 and request.output_ids):
                continue  # a decode row waits for a step without prompts
            fate = self._continue_one(row, plan, budget)
            if fate is RowFate.PREEMPTED:
                break
            if fate is RowFate.PREFILL:
                rows.prefill.append(row)
        if not plan.preempted:
            self.admission.admit_waiting(plan, budget, now, rows)
        if not plan.prefill:  # (what was preempted stays in the plan the decode step goes on)
            return False
        rows.decode_rows = rows.decode()
        plan.decode_lens = self.table.computed[rows.decode_rows] + 1
        return True

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
        ending: list[Ending] = []  # with each one's running row and time
        tokens, first = samples.token_ids.tolist(), len(plan.prefill)
        logprobs = samples.logprobs
        if self.lookahead:  # the decode rows' accepted proposals come before their samples
            self.lookahead.accept(table, plan.decode, rows.decode_rows, tokens[first:], now)
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
                    ending.append((request, reason, running_row, now))
        decode_logprobs = logprobs[first:] if logprobs is not None else None
        self._update_decodes(plan, rows.decode_rows, tokens[first:], decode_logprobs, now, ending)
        self._finish_all(ending)
        return [request for request, _, _, _ in ending]

    def _update_decodes(
        self,
        plan: StepPlan,
        running_rows: DecodeRows,
        tokens: list[int],
        logprobs: list[dict[int, float]] | None,
        now: float,
        ending: list[Ending],
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
                ending.append((request, reason, row_at(running_rows, k), now))

    def _finish_all(self, ending: list[Ending]) -> None:
        """Finishes ending requests, given with their running rows and times, in order, at
        once: taking thousands of rows out one by one would shift the rest."""
        if not ending:
            return
        if len(ending) == 1:  # the common case: one row out
            self.table.remove(ending[0][2])
        else:
            kept = np.ones(len(self.table), dtype=bool)
            kept[[row for _, _, row, _ in ending]] = False
            self.table.keep(kept)
        for request, reason, _, now in ending:
            self._end(request, reason, now)

    # -- runs of decode steps planned elsewhere ----------------------------------------------
    def scheduled_rows(self, plan: StepPlan) -> StepRows | None:
        """Where the plan's requests are among the running rows, while it is the last one
        schedule() gave and its update has not run; None otherwise."""
        step = self._step
        return step if step is not None and step.plan is plan else None

    def apply_decodes(self, run: DecodeRun, token: int, ends: list[float]) -> list[Request]:
        """Does what the run's steps' updates do one by one: each row gets `token` at each
        step's end time while it stays (a run with joining rows starts with the step the
        last schedule() gave, whose update this is). Returns the requests the run finished,
        in the order its steps finish them."""
        if run.requests != self.running:
            raise ValueError("apply_decodes takes a run of the running requests as they are")
        if run.joining:
            self._step = None
        ending = apply_run(self.table, self.stop, run, token, ends)
        self._finish_all(ending)
        return [request for request, _, _, _ in ending]

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
        if self.lookahead:
            self.lookahead.forget(request)
        request.block_hashes = []  # a finished request's hashes are never looked up again
        request.finish(reason, now)
