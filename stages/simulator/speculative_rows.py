"""The real scheduler under speculative decoding: each decode row holds KV room for the
k + 1 slots its verification writes, and gets the tokens its accepted proposals add.

Acceptance is by fractional credit (stages.simulator.speculative.accepted_extra): a row's
n-th verification step brings it floor(n (E - 1)) - floor((n - 1) (E - 1)) tokens besides
the one every step samples, so every row gets E tokens a step on average, deterministically,
and never more than its output length (the workload's) allows. A row whose k lookahead
slots do not fit the free blocks verifies what its blocks hold (its extra tokens are capped
by them); nothing is preempted for lookahead. The token budget counts k + 1 a decode row
(the inner scheduler's decode_tokens), as vLLM and FastDeploy count a verification. Runs of
decode steps do not leap under speculation: the runs' planner (stages.decode_runs) moves
every row by one token a step.
"""

from __future__ import annotations

from collections.abc import Collection

from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request, Samples, StepPlan
from stages.scheduling.scheduler import ChunkedScheduler
from stages.simulator.speculative import accepted_extra


class SpeculativeScheduler:
    """A chunked (or whole) scheduler whose decode rows verify `tokens` proposals a step
    and get `expected` tokens a step on average."""

    def __init__(self, inner: ChunkedScheduler, tokens: int, expected: float) -> None:
        if tokens < 1 or not 1.0 <= expected <= tokens + 1:
            raise ValueError(f"{tokens} proposals cannot give {expected} tokens a step")
        self.inner, self.tokens, self.expected = inner, tokens, expected
        self.splits_prompts = inner.splits_prompts
        self.padded_budget = inner.padded_budget
        self.kv_cache: KVCacheManager = inner.kv_cache
        self._steps: dict[int, int] = {}  # verification steps so far, by seq_id
        self._rows: dict[int, int] = {}  # the last schedule's running row, by seq_id

    @property
    def waiting(self) -> Collection[Request]:
        return self.inner.waiting

    @property
    def running(self) -> Collection[Request]:
        return self.inner.running

    @property
    def has_work(self) -> bool:
        return self.inner.has_work

    def rejection(self, request: Request) -> str | None:
        return self.inner.rejection(request)

    def add(self, request: Request) -> None:
        self.inner.add(request)

    def admit_computed(self, request: Request) -> bool:
        return self.inner.admit_computed(request)

    def abort(self, request: Request, message: str, now: float) -> None:
        self._steps.pop(request.seq_id, None)
        self.inner.abort(request, message, now)

    def schedule(self, now: float) -> StepPlan:
        """The inner scheduler's step; then each decode row takes the blocks its k
        lookahead slots need, where the pool has them."""
        plan = self.inner.schedule(now)
        self._rows = {r.seq_id: i for i, r in enumerate(self.inner.running)}
        for request in plan.decode:
            self.inner.table.allocate(self._rows[request.seq_id], 1 + self.tokens)
        return plan

    def update(self, plan: StepPlan, samples: Samples, now: float) -> list[Request]:
        """Each decode row's accepted proposals first, then the inner update (the step's
        sampled token, stops, finishes)."""
        first = len(plan.prefill)
        tokens = samples.token_ids[first:].tolist()
        for request, token in zip(plan.decode, tokens, strict=True):
            self._accept(request, token, now)
        finished = self.inner.update(plan, samples, now)
        for request in finished:
            self._steps.pop(request.seq_id, None)
        return finished

    def _accept(self, request: Request, token: int, now: float) -> None:
        """The row's extra tokens this step: its credit, capped by its length limit and
        by the KV slots it holds (the step's sampled one comes after them)."""
        steps = self._steps[request.seq_id] = self._steps.get(request.seq_id, 0) + 1
        table, row = self.inner.table, self._rows[request.seq_id]
        limit = self.inner.stop.length_limit(request) - request.num_tokens - 1
        room = int(table.held[row] - table.computed[row]) - 1
        extra = min(accepted_extra(steps, self.expected), limit, room)
        if extra <= 0:
            return
        request.output_ids.extend([token] * extra)
        request.token_times.extend([now] * extra)
        table.add_tokens(row, extra)
        self.kv_cache.cache_computed_blocks(request, int(table.computed[row]))
