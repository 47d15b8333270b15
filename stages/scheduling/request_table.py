"""The scheduler's table of running requests: the requests in the scheduler's order and
their per-row numbers as columns, the one place those numbers live.

A step's decode rows (hundreds a step, tens of millions a trace) are checked by columns
instead of by visiting each Request: which rows are plain decodes (one token that fits the
last block), which may have reached a stop, which filled a block. A Request keeps its
identity, its tokens and their times; how many of its tokens are computed, how many it
output, how long its prompt is, how many KV slots its blocks hold and where `length` ends
it are the table's. Taking a row out takes its request and its numbers out at once.
"""

from __future__ import annotations

import itertools

import numpy as np

from stages.arithmetic import ceil_div
from stages.forward.step_shape import MANY_ROWS
from stages.scheduling.kv_cache import KVCacheManager, blocks_for
from stages.scheduling.request import Request
from stages.scheduling.stopping import StopRule

FIELDS = ("computed", "outputs", "prompt", "held", "limit", "checked")
NUMBERS = FIELDS[:-1]  # the whole numbers, kept as the rows of one array
_PROGRESS = slice(0, 2)  # computed and outputs: what a decode advances, together


class RequestTable:
    def __init__(self, kv_cache: KVCacheManager, stop: StopRule, capacity: int) -> None:
        self.kv_cache = kv_cache
        self.stop = stop
        self.requests: list[Request] = []  # the running requests, oldest admission first
        # computed: tokens whose keys and values are in the cache; outputs: output tokens;
        # prompt: prompt tokens; held: tokens its blocks have room for; limit: the tokens at
        # which `length` ends it. One array, so that taking rows out moves them all at once.
        self._numbers = np.zeros((len(NUMBERS), max(1, capacity)), np.int64)
        self.checked = np.zeros(max(1, capacity), bool)  # StopRule.reason asked at every token
        self._name_numbers()

    def _name_numbers(self) -> None:
        self.computed, self.outputs, self.prompt, self.held, self.limit = self._numbers

    @property
    def size(self) -> int:
        return len(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    def append(self, request: Request, computed: int) -> None:
        """The request joins as the last row, with `computed` tokens in the cache and the
        blocks the cache gave it."""
        row = len(self.requests)
        if row == len(self.checked):
            grown = np.zeros((len(NUMBERS), 2 * row), np.int64)
            grown[:, :row] = self._numbers
            self._numbers = grown
            self.checked = np.resize(self.checked, 2 * row)
            self._name_numbers()
        self.requests.append(request)
        self.computed[row] = computed
        self.outputs[row] = len(request.output_ids)
        self.prompt[row] = request.num_prompt_tokens
        self.held[row] = self.kv_cache.slots_held([request])[0]
        self.limit[row] = self.stop.length_limit(request)
        self.checked[row] = self.stop.checks_each_token(request)

    def allocate(self, row: int, tokens: int) -> bool:
        """Room in the cache for `tokens` more tokens of the row; False (nothing taken)
        where the pool cannot give it."""
        request = self.requests[row]
        if not self.kv_cache.allocate_slots(request, tokens, computed=int(self.computed[row])):
            return False
        self.held[row] = self.kv_cache.slots_held([request])[0]
        return True

    def take_blocks(self, rows: list[int]) -> None:
        """One fresh block more for each of the rows, in their order."""
        self.kv_cache.take_blocks([self.requests[i] for i in rows])
        self.held[rows] += self.kv_cache.block_size

    def add_tokens(self, row: int, count: int) -> None:
        """The row computed `count` more tokens and got them as output."""
        self._numbers[_PROGRESS, row] += count

    def remove(self, row: int) -> Request:
        """Takes the row out; returns its request."""
        end = len(self.requests)
        self._numbers[:, row : end - 1] = self._numbers[:, row + 1 : end]
        self.checked[row : end - 1] = self.checked[row + 1 : end]
        return self.requests.pop(row)

    def keep(self, kept: np.ndarray) -> None:
        """Only the rows `kept` marks (a mask over the rows) stay, in their order."""
        rows = kept.nonzero()[0]
        n = len(rows)
        self.requests[:] = itertools.compress(self.requests, kept.tolist())
        self._numbers[:, :n] = self._numbers[:, rows]
        self.checked[:n] = self.checked[rows]

    def not_plain_decodes(self) -> tuple[list[int], int]:
        """Rows that are not a plain decode: a prefill (the request has no output yet, or
        more than one token to compute), or a decode whose token needs a new block; and
        how many of them, from the first, are such decodes."""
        n = len(self.requests)
        if n <= MANY_ROWS:
            return self._not_plain_few(n)
        computed, outputs = self.computed[:n], self.outputs[:n]
        todo = self.prompt[:n] - computed  # tokens left to compute
        todo += outputs
        # Few numpy calls: a step's rows are often a handful, and each call costs the same.
        # (.nonzero() on the 1-d mask: np.flatnonzero's wrapper costs more than the search)
        others = ((todo != 1) | (outputs == 0) | (computed >= self.held[:n])).nonzero()[0]
        if not len(others):
            return [], 0
        prefills = ((todo[others] != 1) | (outputs[others] == 0)).nonzero()[0]
        return others.tolist(), int(prefills[0]) if len(prefills) else len(others)

    def _not_plain_few(self, n: int) -> tuple[list[int], int]:
        """not_plain_decodes over a few rows, read once into Python: fewer steps than
        numpy's calls, each of which costs as much as a handful of rows here."""
        computed, outputs, prompt, held = self._numbers[:4, :n].tolist()  # as _name_numbers
        rows = zip(computed, outputs, prompt, held, strict=False)  # (strict: a cost per row)
        others = [
            i
            for i, (done, out, prompt_len, room) in enumerate(rows)
            if prompt_len + out - done != 1 or not out or done >= room
        ]
        prefills = (
            k
            for k, i in enumerate(others)
            if prompt[i] + outputs[i] - computed[i] != 1 or not outputs[i]
        )
        return others, next(prefills, len(others))

    def blocks_to_come(self) -> int:
        """KV blocks the rows will still take before `length` ends them."""
        n, bs = len(self.requests), self.kv_cache.block_size
        final = ceil_div(self.limit[:n], bs) * bs  # tokens the blocks at the end hold
        return int(np.maximum(final - self.held[:n], 0).sum()) // bs

    def advance(self, rows: slice | np.ndarray) -> None:
        """The rows each computed one more token and got it as output (a decode)."""
        self._numbers[_PROGRESS, rows] += 1

    def to_look_at(self, rows: slice | np.ndarray, filled: bool) -> list[int]:
        """Which of the decode rows just advanced (their places among `rows`) StopRule.reason
        could end now: those it checks at every token, and those whose length reached their
        limit; with `filled`, also those whose computed tokens just filled a block (end on
        its boundary). One array expression: a step's rows are often a handful."""
        computed = self.computed[rows]
        # A decode row's tokens are its computed ones and the one it just sampled.
        look = computed >= self.limit[rows] - 1
        look |= self.checked[rows]
        if filled:
            look |= computed % self.kv_cache.block_size == 0
        return look.nonzero()[0].tolist()

    # -- runs of decode steps -------------------------------------------------------------
    def only_decoding_to_length(self, n: int) -> bool:
        """Whether each of the first n rows is a decode (it has output and one token left to
        compute) that only its length limit may end (StopRule.reason need not see its
        every token)."""
        outputs = self.outputs[:n]
        others = (self.computed[:n] + 1 != self.prompt[:n] + outputs) | (outputs == 0)
        return not np.count_nonzero(others | self.checked[:n])  # (.any()'s wrapper costs more)

    def steps_to_length(self) -> np.ndarray:
        """[rows] decode steps until each row reaches its length limit (that step ends it)."""
        n = len(self.requests)
        return self.limit[:n] - self.prompt[:n] - self.outputs[:n]

    def first_new_block(self) -> np.ndarray:
        """Each row's next decode step (from 1) that takes a new block: the first whose
        token falls past the room its blocks hold."""
        n = len(self.requests)
        return self.held[:n] - self.computed[:n] + 1

    def steps_with_blocks(self, free: int, limit: int, stays: np.ndarray | None = None) -> int:
        """How many of the next `limit` decode steps `free` blocks cover: a row takes a
        block at its first_new_block step and every block_size steps after, up to its
        `stays` steps (the step it leaves the batch at; by default it stays to `limit`)."""
        n, bs = len(self.requests), self.kv_cache.block_size
        if n * (1 + (limit - 1) // bs) <= free:  # the common run: room for any row's blocks
            return limit
        first = self.first_new_block()
        last = limit if stays is None else np.minimum(stays, limit)
        if int(np.maximum((last - first) // bs + 1, 0).sum()) <= free:
            return limit
        rows, at = recurring(first, limit, bs)
        if stays is not None:
            at = at[at <= stays[rows]]
        return limit if len(at) <= free else int(at[free]) - 1

    def advance_by(self, steps: np.ndarray, takers: np.ndarray) -> None:
        """Each row decoded `steps` tokens, and each of `takers` took a block (a row as
        often as it is listed)."""
        n = len(self.requests)
        self._numbers[_PROGRESS, :n] += steps
        if len(takers):
            self.held[:n] += np.bincount(takers, minlength=n) * self.kv_cache.block_size


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
