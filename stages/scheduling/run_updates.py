"""What a planned run of decode steps does to the running requests and the KV cache: the
updates of its steps one by one, done at once (ChunkedScheduler.apply_decodes).

A run gives exactly what its steps one by one give: the same tokens and token times, the
same finishes, and the KV cache's takes, registrations and frees in the order the steps
meet them. Who plans a run (a simulated device, stages.simulator.fast_forward) reads the
table; only these updates change it.
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from stages.scheduling.request import DecodeRun, FinishReason, Request
from stages.scheduling.request_table import RequestTable
from stages.scheduling.stopping import StopRule

# Runs an iterator to its end, keeping nothing.
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend
_OUTPUT_IDS = operator.attrgetter("output_ids")
_TOKEN_TIMES = operator.attrgetter("token_times")
# What a run of decode steps does to the KV cache within a step, in this order.
_TAKE, _FILL, _GO = 0, 1, 2
# A request that reached its stop, with why, its row and its finish time.
Ending = tuple[Request, FinishReason, int, float]


def apply_run(
    table: RequestTable, stop: StopRule, run: DecodeRun, token: int, ends: list[float]
) -> list[Ending]:
    """The run's steps done on the table's rows: each row gets `token` at each step's end
    time while it stays, its new blocks in the order the steps take them and, with prefix
    caching, its full blocks registered in that order. Returns the rows that reached their
    length, in the order the steps finish them (their finish times: their last steps')."""
    steps, kv, running = run.steps, table.kv_cache, table.requests
    if run.to_length is None:
        raise ValueError("a run to apply knows its rows' lengths")
    if run.joining:  # they prefilled their prompts in the head step
        n = len(running)
        for request in running[n - run.joining :]:
            # Its prompt's blocks register first: its blocks were taken when it was
            # scheduled, and the decodes take and fill theirs after.
            kv.cache_computed_blocks(request, request.num_prompt_tokens)
        # Each counts as a decode of its last prompt token: its first output is the head
        # step's sample, as any decode's.
        table.computed[n - run.joining : n] = table.prompt[n - run.joining : n] - 1
    stays = [left if left < steps else steps for left in run.to_length]
    _append_tokens(running, token, ends, stays)
    n = len(running)
    first_new_block = table.held[:n] - table.computed[:n] + 1
    takers, taken_at = recurring(first_new_block, steps, kv.block_size, run.stays)
    if kv.prefix is None or len(takers) <= kv.pool.num_free:
        # No eviction: taking blocks changes nothing any registration reads.
        kv.take_blocks([running[i] for i in takers.tolist()])
        if kv.prefix is not None:
            take_and_register(table, [], [], stays, steps)
    else:
        take_and_register(table, takers.tolist(), taken_at.tolist(), stays, steps)
    table.advance_by(run.stays, takers)
    ending: list[Ending] = []
    # The rows that reached their length limit, in the order they did.
    at_length = [i for i, left in enumerate(run.to_length) if left <= steps]
    for i in sorted(at_length, key=stays.__getitem__):
        reason = stop.reason(running[i])
        if reason:
            ending.append((running[i], reason, i, ends[stays[i] - 1]))
    return ending


def _append_tokens(running: list[Request], token: int, ends: list[float], stays: list[int]) -> None:
    """Each running row's tokens and their times over the steps it stays."""
    steps = len(ends)
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


def take_and_register(
    table: RequestTable, takers: list[int], taken_at: list[int], stays: list[int], steps: int
) -> None:
    """With prefix caching, the blocks the run's tokens fill registered by content, the
    `takers`' new blocks taken (at their `taken_at` steps) and the blocks of rows that
    leave before the last step let go, in the order the steps meet them: each step
    takes its blocks, registers those it filled, then ends its finished rows. (Only an
    eviction, taking a cached block and forgetting its content, makes the order between
    them matter.) A run has a few rows and events: lists cost less than arrays here."""
    running, kv = table.requests, table.kv_cache
    bs = kv.block_size
    computed = table.computed[: len(running)].tolist()  # before the run
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


def recurring(
    first: np.ndarray, steps: int, period: int, last: np.ndarray | int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Events each row has at its `first` step (from 1) and every `period` steps after, up
    to `steps` (or to each row's `last` step, at most `steps`): their rows and steps, in step
    order and row order within a step (the order a step-by-step run meets them)."""
    end = steps if last is None else last
    if steps <= period:  # the common run: a row has at most one event
        rows = (first <= end).nonzero()[0]
        at = first[rows]
        if len(rows) < 2:  # (most runs: one or none)
            return rows, at
        order = at.argsort(kind="stable")
        return rows[order], at[order]
    counts = np.maximum(0, (end - first) // period + 1)
    rows = np.arange(len(first)).repeat(counts)
    starts = (counts.cumsum() - counts).repeat(counts)
    at = first[rows] + period * (np.arange(len(rows)) - starts)
    order = np.lexsort((rows, at))
    return rows[order], at[order]
