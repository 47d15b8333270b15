"""Speculative decoding as step-formation policy: each decode row holds KV room for the
`slots` proposals its verification writes beside its token, and gets the tokens its
accepted proposals add.

How many a row's n-th verification accepts is the device's to say (`accepted`: a simulated
device's fractional credit, stages.simulator.speculative.accepted_extra); the scheduler
hands them out, never past the row's length limit nor past the KV slots it holds. A row
whose lookahead slots do not fit the free blocks verifies what its blocks hold (its extra
tokens are capped by them); nothing is preempted for lookahead. What a decode row costs
the step's budget (k + 1, as vLLM and FastDeploy count a verification) is the scheduler's
decode_tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stages.scheduling.request import Request
from stages.scheduling.request_table import RequestTable
from stages.scheduling.step_rows import DecodeRows


class Lookahead:
    """A decode row's `slots` proposals a step; `accepted(n)`: the extra tokens a row's
    n-th verification step accepts."""

    def __init__(self, slots: int, accepted: Callable[[int], int]) -> None:
        if slots < 1:
            raise ValueError(f"lookahead_slots={slots}: a verification checks 1 or more")
        self.slots, self.accepted = slots, accepted
        self._steps: dict[int, int] = {}  # verification steps so far, by seq_id

    def reserve(self, table: RequestTable, decode_rows: DecodeRows) -> None:
        """Each decode row (in the plan's order) takes the blocks its token and its
        proposals need, where the pool has them."""
        rows = range(len(table))[decode_rows] if isinstance(decode_rows, slice) else decode_rows
        for row in rows:
            table.allocate(int(row), 1 + self.slots)

    def accept(
        self,
        table: RequestTable,
        decode: Sequence[Request],
        decode_rows: DecodeRows,
        token: list[int],
        now: float,
    ) -> None:
        """Each decode row's accepted proposals this step, before the step's own token:
        its credit, capped by its length limit and by the KV slots it holds."""
        rows = range(len(table))[decode_rows] if isinstance(decode_rows, slice) else decode_rows
        kv, steps = table.kv_cache, self._steps
        for request, row, sampled in zip(decode, rows, token, strict=True):
            n = steps[request.seq_id] = steps.get(request.seq_id, 0) + 1
            row = int(row)
            limit = int(table.limit[row]) - request.num_tokens - 1
            room = int(table.held[row] - table.computed[row]) - 1
            extra = min(self.accepted(n), limit, room)
            if extra <= 0:
                continue
            request.output_ids.extend([sampled] * extra)
            request.token_times.extend([now] * extra)
            table.add_tokens(row, extra)
            kv.cache_computed_blocks(request, int(table.computed[row]))

    def forget(self, request: Request) -> None:
        """The request ended: its count goes."""
        self._steps.pop(request.seq_id, None)
