"""The scheduler's running requests as arrays of per-row numbers, in the scheduler's order.

A step's decode rows (hundreds a step, tens of millions a trace) are checked by these
arrays instead of by visiting each Request: which rows are plain decodes (one token that
fits the last block), which may have reached a stop, which filled a block. Row i mirrors
`running[i]`; the scheduler re-reads a row from its Request whenever it changes the row in
any other way than the decode update (`advance`), and removes rows as it removes requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stages.kv_cache import KVCacheManager
from stages.request import Request
from stages.stopping import StopRule

FIELDS = ("computed", "outputs", "prompt", "held", "limit", "checked")


class RunningRows:
    def __init__(self, kv_cache: KVCacheManager, stop: StopRule, capacity: int) -> None:
        self.kv_cache = kv_cache
        self.stop = stop
        self.size = 0
        capacity = max(1, capacity)
        self.computed = np.zeros(capacity, np.int64)  # num_computed
        self.outputs = np.zeros(capacity, np.int64)  # output tokens
        self.prompt = np.zeros(capacity, np.int64)  # prompt tokens
        self.held = np.zeros(capacity, np.int64)  # tokens its blocks have room for
        self.limit = np.zeros(capacity, np.int64)  # num_tokens at which `length` ends it
        self.checked = np.zeros(capacity, bool)  # StopRule.reason asked at every token

    def append(self, request: Request) -> None:
        if self.size == len(self.computed):
            for name in FIELDS:
                setattr(self, name, np.resize(getattr(self, name), 2 * self.size))
        self.size += 1
        self.read(self.size - 1, request)

    def read(self, row: int, request: Request) -> None:
        """Row `row` from its request, after the scheduler changed it one by one."""
        self.computed[row] = request.num_computed
        self.outputs[row] = len(request.output_ids)
        self.prompt[row] = request.num_prompt_tokens
        self.held[row] = self.kv_cache.slots_held([request])[0]
        self.limit[row] = self.stop.length_limit(request)
        self.checked[row] = self.stop.checks_each_token(request)

    def read_held(self, row: int, request: Request) -> None:
        """Row `row`'s blocks, after a decode took room for its token (nothing else of
        the row changes before the step's update)."""
        self.held[row] = self.kv_cache.slots_held([request])[0]

    def remove(self, row: int) -> None:
        end = self.size
        for name in FIELDS:
            values = getattr(self, name)
            values[row : end - 1] = values[row + 1 : end]
        self.size -= 1

    def keep(self, rows: np.ndarray) -> None:
        """Only these rows stay, in this (increasing) order: the others are gone."""
        n = len(rows)
        for name in FIELDS:
            values = getattr(self, name)
            values[:n] = values[rows]
        self.size = n

    def not_plain_decodes(self) -> list[int]:
        """Rows that are not a plain decode: a prefill (the request has no output yet, or
        more than one token to compute), or a decode whose token needs a new block."""
        n = self.size
        computed = self.computed[:n]
        decoding = (self.outputs[:n] > 0) & (computed + 1 == self.prompt[:n] + self.outputs[:n])
        return np.flatnonzero(~(decoding & (computed < self.held[:n]))).tolist()

    def blocks_to_come(self) -> int:
        """KV blocks the rows will still take before `length` ends them."""
        n, bs = self.size, self.kv_cache.block_size
        final = -(-self.limit[:n] // bs) * bs  # tokens the blocks at the end hold
        return int(np.maximum(final - self.held[:n], 0).sum()) // bs

    def advance(self, rows: np.ndarray) -> None:
        """The rows each computed one more token and got it as output (a decode)."""
        self.computed[rows] += 1
        self.outputs[rows] += 1

    def may_stop(self, rows: np.ndarray) -> np.ndarray:
        """Which of the rows StopRule.reason could end now: those it checks at every token,
        and those whose length reached their limit."""
        tokens = self.prompt[rows] + self.outputs[rows]
        return self.checked[rows] | (tokens >= self.limit[rows])

    def filled_a_block(self, rows: np.ndarray) -> np.ndarray:
        """Which of the rows' computed tokens just filled a block (end on its boundary)."""
        return self.computed[rows] % self.kv_cache.block_size == 0

    def mirrors(self, running: Sequence[Request]) -> bool:
        """Whether every row equals its request (what the tests check after each step)."""
        if self.size != len(running):
            return False
        copy = RunningRows(self.kv_cache, self.stop, len(running))
        for request in running:
            copy.append(request)
        n = self.size
        return all(
            np.array_equal(getattr(self, name)[:n], getattr(copy, name)[:n]) for name in FIELDS
        )
