"""Fast-forward: runs of decode steps a simulated device does at once (leaps), planned from
the scheduler's request table and handed back to it to apply (ChunkedScheduler.
apply_decodes).

A run is planned where nothing else could happen between its steps: every running row
only decodes, no waiting request could be admitted, and only the rows' length limits may
end them. A leap gives exactly what its steps one by one give (tests/test_leaps.py). The
planner only reads the table; the scheduler applies the run.
"""

from __future__ import annotations

import numpy as np

from stages.forward.step_shape import MANY_ROWS
from stages.interfaces import AppliesDecodeRuns
from stages.scheduling.kv_cache import blocks_for
from stages.scheduling.request import DecodeRun, StepPlan
from stages.scheduling.request_table import RequestTable
from stages.scheduling.run_updates import recurring


class DecodeRunPlanner:
    """Plans the scheduler's next steps as one run where they can only decode."""

    def __init__(self, scheduler: AppliesDecodeRuns) -> None:
        self.scheduler = scheduler

    def steady_decodes(self, limit: int, finishes: float = 0) -> DecodeRun | None:
        """The next steps, up to `limit`, while each can only decode the running requests,
        a step-by-step run doing nothing else between them (no admission or preemption);
        None where the next step may do anything else. Only the length limit may stop a
        row (StopRule checks no row's every token); a row that reaches it leaves the run
        there, and at most `finishes` rows leave before its last step (none while a
        request waits: their blocks may let it in)."""
        scheduler = self.scheduler
        table, budget = scheduler.table, scheduler.max_tokens
        n = len(table)
        if not n or n > budget or scheduler.may_admit(budget - n):
            return None
        if not only_decoding_to_length(table, n):
            return None
        return self._decode_run(table.computed[:n], limit, finishes)

    def decodes_after(self, plan: StepPlan, limit: int, finishes: float = 0) -> DecodeRun | None:
        """The step of `plan` (the last schedule() gave, not run yet) and those after it, up
        to `limit` in all, as steady_decodes gives them, where the plan's step admits
        requests that each prefill their whole prompt beside every running request's
        decode, and each produces two tokens at least (its head step then ends none of
        them); None where it does not, or a later step may do anything else. Each
        admitted row counts as a decode of its last prompt token (DecodeRun's joining)."""
        scheduler = self.scheduler
        step, table, budget = scheduler.scheduled_rows(plan), scheduler.table, scheduler.max_tokens
        if step is None or plan.preempted or plan.failed:
            return None
        n, joining = len(table), len(plan.prefill)
        old = n - joining
        if not joining or len(plan.decode) != old or step.prefill != list(range(old, n)):
            return None
        if n > budget or scheduler.may_admit(budget - n):
            return None
        # No row's every token is checked (count_nonzero: numpy's any() costs 1 us more).
        if np.count_nonzero(table.checked[:n]):
            return None
        # Few rows join at once: they are looked at one by one.
        for row, chunk in enumerate(plan.prefill, old):
            request = chunk.request
            if chunk.end != request.num_prompt_tokens or request.output_ids:
                return None
            if table.limit[row] - request.num_prompt_tokens < 2:
                return None
        computed = table.computed[:n].copy()
        computed[old:] = table.prompt[old:n] - 1  # as the run counts a joining row
        return self._decode_run(computed, limit, finishes, joining)

    def _decode_run(
        self, computed: np.ndarray, limit: int, finishes: float, joining: int = 0
    ) -> DecodeRun | None:
        """steady_decodes' run from the rows as they stand with `computed` tokens each (their
        last `joining` prefilling in the first step)."""
        scheduler = self.scheduler
        table = scheduler.table
        n = len(table)
        left = steps_to_length(table)
        leaving = 0 if scheduler.waiting else int(min(finishes, n - 1))
        # The step the leaving-th row (from 0, in the order they leave) reaches its length.
        ahead = left.tolist()
        first_to_leave = min(ahead)
        if leaving == n - 1 or not leaving:  # the common runs: the last or the first
            last = max(ahead) if leaving else first_to_leave
        else:
            last = int(np.partition(left, leaving)[leaving])
        steps = min(limit, last)
        free = scheduler.kv_cache.num_free_blocks
        steps = steps_with_blocks(table, computed, free, steps, left)
        if steps < 1:
            return None
        lens, stays = computed + 1, np.minimum(left, steps)
        bs, batch, slots = table.kv_cache.block_size, None, None
        if n <= MANY_ROWS:
            blocks, batch, slots = few_rows_columns(lens.tolist(), stays.tolist(), steps, bs)
        else:
            leaves = first_to_leave < steps  # a row leaves before the last step
            blocks = listed_blocks(lens, steps, bs, stays if leaves else None)
        return DecodeRun(
            list(table.requests), lens, stays, blocks, bs, joining=joining,
            to_length=ahead, batch_rows=batch, batch_slots=slots,
        )  # fmt: skip


def only_decoding_to_length(table: RequestTable, n: int) -> bool:
    """Whether each of the first n rows is a decode (it has output and one token left to
    compute) that only its length limit may end (StopRule.reason need not see its every
    token)."""
    outputs = table.outputs[:n]
    others = (table.computed[:n] + 1 != table.prompt[:n] + outputs) | (outputs == 0)
    return not np.count_nonzero(others | table.checked[:n])  # (.any()'s wrapper costs more)


def steps_to_length(table: RequestTable) -> np.ndarray:
    """[rows] decode steps until each row reaches its length limit (that step ends it)."""
    n = len(table)
    return table.limit[:n] - table.prompt[:n] - table.outputs[:n]


def steps_with_blocks(
    table: RequestTable,
    computed: np.ndarray,
    free: int,
    limit: int,
    stays: np.ndarray | None = None,
) -> int:
    """How many of the next `limit` decode steps `free` blocks cover for the table's rows
    with `computed` tokens each: a row takes a block at its first step whose token falls
    past the room its blocks hold and every block_size steps after, up to its `stays`
    steps (the step it leaves the batch at; by default it stays to `limit`)."""
    n, bs = len(computed), table.kv_cache.block_size
    if n * (1 + (limit - 1) // bs) <= free:  # the common run: room for any row's blocks
        return limit
    first = table.held[:n] - computed + 1
    last = limit if stays is None else np.minimum(stays, limit)
    if int(np.maximum((last - first) // bs + 1, 0).sum()) <= free:
        return limit
    rows, at = recurring(first, limit, bs)
    if stays is not None:
        at = at[at <= stays[rows]]
    return limit if len(at) <= free else int(at[free]) - 1


def listed_blocks(
    lens: np.ndarray, steps: int, block_size: int, stays: np.ndarray | None = None
) -> np.ndarray:
    """[steps] the blocks decode rows of `lens` tokens fill in each of `steps` steps, every
    row one token longer each step: a row fills one more at each step its length passes a
    multiple of block_size. A row leaves after its `stays` steps (by default it stays)."""
    bs = block_size
    # Counted as changes from step to step: each row's blocks at step 0, one more at each
    # step (from 0) whose token starts a block while the row stays, and all of the row's
    # taken off at the step it has left by.
    first = (-lens) % bs + 1  # each row's first step whose token starts a block
    last = steps - 1 if stays is None else stays - 1  # each row's last step
    if steps <= bs:  # the common run: a row starts at most one block
        starts = first[first <= last]
    else:
        starts = recurring(first, steps - 1, bs, last)[1]
    change = np.bincount(starts, minlength=steps)
    if stays is not None:  # rows leave with the blocks their last step filled
        held = (lens + stays + (bs - 2)) // bs
        change = change - np.bincount(stays, held, minlength=steps + 1)[:steps].astype(np.int64)
    change[0] = blocks_for(lens, bs).sum()
    return change.cumsum()


def few_rows_columns(
    lens: list[int], stays: list[int], steps: int, block_size: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """[steps] each step's blocks (listed_blocks'), rows and KV slots (DecodeRun's batch and
    slots; None where no row leaves: DecodeRun's own then cost less) for a few decode rows
    of `lens` tokens that stay `stays` steps, counted row by row in Python: fewer steps than
    the numpy calls that count them, each of which costs as much as a few rows' work."""
    bs = block_size
    # Changes from step to step, as listed_blocks counts them: a row's blocks at the start,
    # one more at each step whose token starts a block, all taken off (with its tokens and
    # itself) at the step it has left by.
    blocks, held, leaving = [0] * steps, 0, []
    for n, stayed in zip(lens, stays, strict=True):
        held += (n + bs - 1) // bs
        start = (-n) % bs + 1  # its first step whose token starts a block
        while start < stayed:
            blocks[start] += 1
            start += bs
        if stayed < steps:
            leaving.append((n, stayed))
    blocks[0] += held
    if not leaving:
        return np.array(blocks, np.int64).cumsum(), None, None
    rows, tokens = [0] * steps, [0] * steps
    for n, stayed in leaving:
        blocks[stayed] -= (n + stayed + bs - 2) // bs
        rows[stayed] -= 1
        tokens[stayed] -= n
    rows[0], tokens[0] = len(lens), sum(lens)
    listed, batch, kept = np.array([blocks, rows, tokens], np.int64).cumsum(axis=1)
    return listed, batch, kept + batch * np.arange(steps)
