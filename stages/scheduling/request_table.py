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
from collections.abc import Iterable

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

    def free_to_end(self) -> int:
        """The free KV blocks less those the rows will still take before `length` ends them."""
        return self.kv_cache.num_free_blocks - self.blocks_to_come()

    def fitting_to_end(self, waiting: Iterable[Request], room: int, max_model_len: int) -> int:
        """How many of the first `room` of `waiting` the pool holds at their full length
        (up to max_model_len), beside the blocks the rows will still take."""
        free, bs = self.free_to_end(), self.kv_cache.block_size
        # Each takes a block at least: no more than free + 1 of them need looking at.
        heads = itertools.islice(waiting, max(min(room, free + 1), 0))
        totals = np.fromiter((r.num_prompt_tokens + r.max_new_tokens for r in heads), np.int64)
        needed = np.cumsum(blocks_for(np.minimum(totals, max_model_len), bs))
        return int(np.searchsorted(needed, free, side="right"))

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

    def advance_by(self, steps: np.ndarray, takers: np.ndarray) -> None:
        """Each row decoded `steps` tokens, and each of `takers` took a block (a row as
        often as it is listed)."""
        n = len(self.requests)
        self._numbers[_PROGRESS, :n] += steps
        if len(takers):
            self.held[:n] += np.bincount(takers, minlength=n) * self.kv_cache.block_size
