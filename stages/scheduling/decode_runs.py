"""Runs of decode steps done at once (a simulated device's leaps): what the scheduler says
such a run may be and what its steps do to the running requests and the KV cache.

A run gives exactly what its steps one by one give (tests/test_leaps.py): the same tokens
and token times, the same finishes, and the KV cache's takes, registrations and frees in
the order the steps meet them. `DecodeRuns` is a part of `ChunkedScheduler` (stages.
scheduler), kept apart so that the step-by-step policy reads on its own; it reads the
scheduler's running requests and their rows, its waiting queue and its KV cache.
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from stages.forward.step_shape import MANY_ROWS
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import DecodeRun, FinishReason, Request, StepPlan
from stages.scheduling.request_table import (
    RequestTable,
    few_rows_columns,
    listed_blocks,
    recurring,
)
from stages.scheduling.step_rows import StepRows
from stages.scheduling.stopping import StopRule

# Runs an iterator to its end, keeping nothing.
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend
_OUTPUT_IDS = operator.attrgetter("output_ids")
_TOKEN_TIMES = operator.attrgetter("token_times")
# What a run of decode steps does to the KV cache within a step, in this order.
_TAKE, _FILL, _GO = 0, 1, 2


class DecodeRuns:
    """The scheduler's runs of decode steps (stages.interfaces.PlansDecodeRuns)."""

    # The scheduler's, read here.
    waiting: deque[Request]
    table: RequestTable
    kv_cache: KVCacheManager
    stop: StopRule
    max_tokens: int
    block_size: int
    _step: StepRows | None
    # Whether a step whose decodes leave `left` of the budget could admit the first
    # waiting request.
    _may_admit: Callable[[int], bool]
    # Ends these requests, given with their rows, at their times.
    _finish_all: Callable[[list[tuple[Request, FinishReason, int]], list[float]], None]

    @property
    def running(self) -> list[Request]:
        return self.table.requests

    def steady_decodes(self, limit: int, finishes: float = 0) -> DecodeRun | None:
        """The next steps, up to `limit`, while each can only decode the running requests,
        a step-by-step run doing nothing else between them (no admission or preemption);
        None where the next step may do anything else. Only the length limit may stop a
        row (StopRule checks no row's every token); a row that reaches it leaves the run
        there, and at most `finishes` rows leave before its last step (none while a
        request waits: their blocks may let it in)."""
        n = len(self.running)
        if not n or n > self.max_tokens or self._may_admit(self.max_tokens - n):
            return None
        if not self.table.only_decoding_to_length(n):
            return None
        return self._decode_run(limit, finishes)

    def decodes_after(self, plan: StepPlan, limit: int, finishes: float = 0) -> DecodeRun | None:
        """The step of `plan` (the last schedule() gave, not run yet) and those after it, up
        to `limit` in all, as steady_decodes gives them, where the plan's step admits
        requests that each prefill their whole prompt beside every running request's
        decode, and each produces two tokens at least (its head step then ends none of
        them); None where it does not, or a later step may do anything else. Each
        admitted row counts as a decode of its last prompt token (DecodeRun's joining)."""
        step, running, rows = self._step, self.running, self.table
        if step is None or step.plan is not plan or plan.preempted or plan.failed:
            return None
        n, joining = len(running), len(plan.prefill)
        old = n - joining
        if not joining or len(plan.decode) != old or step.prefill != list(range(old, n)):
            return None
        if n > self.max_tokens or self._may_admit(self.max_tokens - n):
            return None
        # No row's every token is checked (count_nonzero: numpy's any() costs 1 us more).
        if np.count_nonzero(rows.checked[:n]):
            return None
        # Few rows join at once: they are looked at one by one.
        for row, chunk in enumerate(plan.prefill, old):
            request = chunk.request
            if chunk.end != request.num_prompt_tokens or request.output_ids:
                return None
            if rows.limit[row] - request.num_prompt_tokens < 2:
                return None
        # Each joining row counts as a decode of its last prompt token: its first output is
        # then the head step's sample, as any decode's.
        rows.computed[old:n] = rows.prompt[old:n] - 1
        run = self._decode_run(limit, finishes, joining)
        if run is None:  # the rows are where the plan's step starts them again
            for row, chunk in enumerate(plan.prefill, old):
                rows.computed[row] = chunk.start
        return run

    def _decode_run(self, limit: int, finishes: float, joining: int = 0) -> DecodeRun | None:
        """steady_decodes' run from the rows as they stand (their last `joining` prefilling
        in the first step)."""
        rows, n = self.table, len(self.running)
        left = rows.steps_to_length()
        leaving = 0 if self.waiting else int(min(finishes, n - 1))
        # The step the leaving-th row (from 0, in the order they leave) reaches its length.
        ahead = left.tolist()
        first_to_leave = min(ahead)
        if leaving == n - 1 or not leaving:  # the common runs: the last or the first
            last = max(ahead) if leaving else first_to_leave
        else:
            last = int(np.partition(left, leaving)[leaving])
        steps = min(limit, last)
        steps = rows.steps_with_blocks(self.kv_cache.num_free_blocks, steps, left)
        if steps < 1:
            return None
        lens, stays = rows.computed[:n] + 1, np.minimum(left, steps)
        bs, batch, slots = self.block_size, None, None
        if n <= MANY_ROWS:
            blocks, batch, slots = few_rows_columns(lens.tolist(), stays.tolist(), steps, bs)
        else:
            leaves = first_to_leave < steps  # a row leaves before the last step
            blocks = listed_blocks(lens, steps, bs, stays if leaves else None)
        return DecodeRun(
            list(self.running), lens, stays, blocks, bs, joining=joining,
            to_length=ahead, batch_rows=batch, batch_slots=slots,
        )  # fmt: skip

    def advance_decodes(self, run: DecodeRun, token: int, ends: list[float]) -> list[Request]:
        """The run's steps done: each row gets `token` at each step's end time while it
        stays, its new blocks in the order the steps take them and, with prefix caching,
        its full blocks registered in that order; the rows that reached their length end
        at their last step's end. Returns those, in the order the steps finish them."""
        steps, bs = run.steps, self.block_size
        running, rows, kv = self.running, self.table, self.kv_cache
        if run.requests != running:
            raise ValueError("advance_decodes takes the run the scheduler just returned")
        if run.joining:  # the head step: its plan is done here, not by update
            self._step = None
            for request in running[len(running) - run.joining :]:
                # Its prompt's blocks register first: its blocks were taken when it was
                # scheduled, and the decodes take and fill theirs after.
                kv.cache_computed_blocks(request, request.num_prompt_tokens)
        if run.to_length is None:
            raise ValueError("advance_decodes takes a run that knows its rows' lengths")
        stays = [left if left < steps else steps for left in run.to_length]
        self._append_tokens(token, ends, stays)
        takers, taken_at = recurring(rows.first_new_block(), steps, bs, run.stays)
        if kv.prefix is None or len(takers) <= kv.pool.num_free:
            # No eviction: taking blocks changes nothing any registration reads.
            kv.take_blocks([running[i] for i in takers.tolist()])
            if kv.prefix is not None:
                self._take_and_register([], [], stays, steps)
        else:
            self._take_and_register(takers.tolist(), taken_at.tolist(), stays, steps)
        rows.advance_by(run.stays, takers)
        ending: list[tuple[Request, FinishReason, int]] = []
        # The rows that reached their length limit, in the order they did.
        at_length = [i for i, left in enumerate(run.to_length) if left <= steps]
        for i in sorted(at_length, key=stays.__getitem__):
            reason = self.stop.reason(running[i])
            if reason:
                ending.append((running[i], reason, i))
        self._finish_all(ending, [ends[stays[i] - 1] for _, _, i in ending])
        return [request for request, _, _ in ending]

    def _append_tokens(self, token: int, ends: list[float], stays: list[int]) -> None:
        """Each running row's tokens and their times over the steps it stays."""
        running, steps = self.running, len(ends)
        tokens = [token] * steps
        if min(stays) == steps:  # no row leaves: the same lists for every row
            _consume(map(list.extend, map(_OUTPUT_IDS, running), itertools.repeat(tokens)))
            _consume(map(list.extend, map(_TOKEN_TIMES, running), itertools.repeat(ends)))
            return
        for request, stayed in zip(running, stays, strict=True):
            if stayed == steps:  # most rows: the run's lists as they are
                request.output_ids.extend(tokens)
                request.token_times.extend(ends)
            else:
                request.output_ids.extend(tokens[:stayed])
                request.token_times.extend(ends[:stayed])

    def _take_and_register(
        self, takers: list[int], taken_at: list[int], stays: list[int], steps: int
    ) -> None:
        """With prefix caching, the blocks the run's tokens fill registered by content, the
        `takers`' new blocks taken (at their `taken_at` steps) and the blocks of rows that
        leave before the last step let go, in the order the steps meet them: each step
        takes its blocks, registers those it filled, then ends its finished rows. (Only an
        eviction, taking a cached block and forgetting its content, makes the order between
        them matter.) A run has a few rows and events: lists cost less than arrays here."""
        running, kv, bs = self.running, self.kv_cache, self.block_size
        computed = self.table.computed[: len(running)].tolist()  # before the run
        # (step, kind, row): a step's takes, then its registrations, then its rows leaving.
        # A row fills a block at each step its computed tokens reach a multiple of bs.
        events = [
            (step, _FILL, row)
            for row, (done, stay) in enumerate(zip(computed, stays, strict=True))
            for step in range(bs - done % bs, stay + 1, bs)
        ]
        if takers:  # else the leaving rows' blocks may go after the rest (no eviction)
            events += zip(taken_at, itertools.repeat(_TAKE), takers)
            events += ((stay, _GO, row) for row, stay in enumerate(stays) if stay < steps)
        if not events:
            return
        events.sort()
        taking: list[Request] = []  # takes in a row, taken at once
        for step, kind, row in events:
            if kind == _TAKE:
                taking.append(running[row])
                continue
            if taking:
                kv.take_blocks(taking)
                taking = []
            if kind == _FILL:
                kv.cache_computed_blocks(running[row], computed[row] + step)
            else:
                kv.free(running[row])  # finishing it later frees nothing more
        if taking:
            kv.take_blocks(taking)
