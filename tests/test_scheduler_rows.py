"""The scheduler's array path (runs of plain decodes joined in one slice, decode rows
advanced and checked by arrays, finishes after every row) against a plain scheduler that
takes every row one by one, as the scheduler did before: the same plans, tokens, times,
stops, preemptions and cache, step by step, on workloads that take both sides of every
condition (plain decodes and decodes needing a block, prefills, preemption, prefix cache
on and off, length, max_model_len, end-of-sequence and stop-string stops)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import ChunkedSchedulerConf, WholeSchedulerConf
from stages.forward.step_shape import MANY_ROWS
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request, Samples
from stages.scheduling.request_table import FIELDS, RequestTable
from stages.scheduling.scheduler import ChunkedScheduler
from stages.scheduling.stopping import StopRule
from stages.scheduling.whole_prompt import WholeScheduler
from tests.helpers import schema_kwargs

BS = 4
EOS = 9


class RowByRow:
    """Overrides of the array path with the plain per-row walk and update."""

    def _continue_running(self, plan, budget, rows) -> None:
        i = 0
        while i < len(self.running) and budget.left > 0:
            kind = self._continue_one(i, plan, budget)
            if kind == "preempted":
                return
            if kind == "decode":
                rows.decode_spans.append((i, i + 1))
            elif kind == "prefill":
                rows.prefill.append(i)
            i += 1

    def update(self, plan, samples, now):
        """Each row in turn: its computed tokens, its sample, its stop, its finish at once
        (which moves the rows after it: each row is looked up where it is now)."""
        self._step = None
        finished = []
        table = self.table
        entries = [(c.request, c.end, c.is_final) for c in plan.prefill]
        entries += [(r, None, True) for r in plan.decode]
        for row, (request, end, keeps_sample) in enumerate(entries):
            i = self.running.index(request)
            computed = end if end is not None else int(table.computed[i]) + 1
            table.computed[i] = computed
            self.kv_cache.cache_computed_blocks(request, computed)
            if not keeps_sample:
                continue
            request.append_token(int(samples.token_ids[row]), now, None)
            table.outputs[i] += 1
            reason = self.stop.reason(request)
            if reason:
                self.finish(request, reason, now)
                finished.append(request)
        return finished


class PlainChunked(RowByRow, ChunkedScheduler):
    pass


class PlainWhole(RowByRow, WholeScheduler):
    pass


def decode_text(ids) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)


def make_requests(seed: int, count: int, prefix: list[int]) -> list[Request]:
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        own = rng.integers(0, 8, int(rng.integers(1, 14))).tolist()
        ids = (prefix if i % 2 else []) + own
        requests.append(
            Request(
                id=f"r{i}",
                index=i,
                prompt="x",
                prompt_ids=ids,
                max_new_tokens=int(rng.integers(1, 14)),
                ignore_eos=bool(i % 3 == 0),
                stop=["cf"] if i % 5 == 1 else [],  # tokens 2 then 5
            )
        )
    return requests


def token(request: Request) -> int:
    """The next token of a request, from its index and output count alone: both
    schedulers see the same tokens whatever the steps."""
    return (request.index * 7 + len(request.output_ids) * 3) % 10  # 9 is the EOS


def build(cls, requests, num_blocks: int, prefix_caching: bool, max_tokens: int, **kw):
    kv = KVCacheManager(num_blocks, BS, prefix_caching=prefix_caching)
    stop = StopRule([EOS], 24, decode_text)
    conf = WholeSchedulerConf if issubclass(cls, WholeScheduler) else ChunkedSchedulerConf
    limits = schema_kwargs(conf, max_tokens=max_tokens, max_num_seqs=5, max_model_len=24, **kw)
    return cls(kv_cache=kv, stop=stop, **limits)


def assert_tables_agree(fast, plain, where: str) -> None:
    """The array path's table equals the row-by-row one, column by column; the columns a
    request or the cache also tells equal what they tell."""
    n = len(fast.running)
    assert [r.id for r in fast.running] == [r.id for r in plain.running], where
    for name in FIELDS:
        column, row_by_row = getattr(fast.table, name)[:n], getattr(plain.table, name)[:n]
        assert np.array_equal(column, row_by_row), f"{where}: {name}"
    assert fast.table.outputs[:n].tolist() == [len(r.output_ids) for r in fast.running], where
    assert fast.table.prompt[:n].tolist() == [len(r.prompt_ids) for r in fast.running], where
    assert fast.table.held[:n].tolist() == fast.kv_cache.slots_held(fast.running), where


def plan_of(plan) -> tuple:
    return (
        [(c.request.id, c.start, c.end, c.cached) for c in plan.prefill],
        [r.id for r in plan.decode],
        [r.id for r in plan.preempted],
        [r.id for r in plan.failed],
    )


def serve_both(seed, count, num_blocks, prefix_caching, max_tokens, whole=False):
    prefix = list(range(2 * BS))
    fast_reqs = make_requests(seed, count, prefix)
    plain_reqs = make_requests(seed, count, prefix)
    fast_cls, plain_cls = (
        (WholeScheduler, PlainWhole) if whole else (ChunkedScheduler, PlainChunked)
    )
    fast = build(fast_cls, fast_reqs, num_blocks, prefix_caching, max_tokens)
    plain = build(plain_cls, plain_reqs, num_blocks, prefix_caching, max_tokens)
    steps = 0
    kinds = {"plain runs": 0, "block needed": 0, "preempted": 0, "finished": 0}
    while fast.has_work or plain.has_work or steps < count:
        if steps < count:  # one arrival a step
            for sched, reqs in ((fast, fast_reqs), (plain, plain_reqs)):
                if not sched.rejection(reqs[steps]):
                    sched.add(reqs[steps])
        steps += 1
        assert steps < 5_000, "the schedulers did not finish"
        if not fast.has_work:
            continue
        not_plain = set(fast.table.not_plain_decodes()[0])
        kinds["block needed"] += sum(  # decoding, but the token needs a new block
            1
            for i in not_plain
            if fast.running[i].output_ids
            and fast.running[i].num_tokens - fast.table.computed[i] == 1
        )
        kinds["plain runs"] += len(fast.running) - len(not_plain)
        got, want = fast.schedule(float(steps)), plain.schedule(float(steps))
        assert plan_of(got) == plan_of(want), f"step {steps}"
        kinds["preempted"] += len(got.preempted)
        if got.empty:
            continue
        for plan, sched in ((got, fast), (want, plain)):
            tokens = np.array([token(r) for r in plan.sampled_requests], dtype=np.int64)
            finished = sched.update(plan, Samples(tokens), float(steps))
            plan.finished_ids = [r.id for r in finished]
        assert got.finished_ids == want.finished_ids, f"step {steps}"
        kinds["finished"] += len(got.finished_ids)
        assert_tables_agree(fast, plain, f"step {steps}")
        assert fast.kv_cache.num_free_blocks == plain.kv_cache.num_free_blocks
        if prefix_caching:
            assert fast.kv_cache.prefix.block_of == plain.kv_cache.prefix.block_of
            assert list(fast.kv_cache.prefix.unheld) == list(plain.kv_cache.prefix.unheld)
    for a, b in zip(fast_reqs, plain_reqs, strict=True):
        assert (a.output_ids, a.token_times, a.finish_reason, a.error) == (
            b.output_ids,
            b.token_times,
            b.finish_reason,
            b.error,
        )
        assert (a.num_preemptions, a.cached_tokens) == (b.num_preemptions, b.cached_tokens)
    return fast_reqs, kinds


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix cache", "no cache"])
def test_array_path_equals_row_by_row_and_takes_every_branch(prefix_caching):
    requests, kinds = serve_both(
        seed=1, count=40, num_blocks=14, prefix_caching=prefix_caching, max_tokens=12
    )
    reasons = {r.finish_reason for r in requests}
    assert {"stop", "length"} <= reasons
    assert any(len(r.prompt_ids) + len(r.output_ids) == 24 for r in requests)  # max_model_len
    assert any(r.stop and r.finish_reason == "stop" and EOS not in r.output_ids for r in requests)
    assert all(kinds[k] > 0 for k in kinds), kinds
    if prefix_caching:
        assert sum(r.cached_tokens for r in requests) > 0, "no prefix was found in the cache"


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 25),
    num_blocks=st.integers(8, 30),
    prefix_caching=st.booleans(),
    max_tokens=st.sampled_from([4, 8, 12, 32]),
    whole=st.booleans(),
)
def test_array_path_equals_row_by_row_for_any_workload(
    seed, count, num_blocks, prefix_caching, max_tokens, whole
):
    if whole and max_tokens < 32:
        max_tokens = 32  # scheduler=whole needs a budget for a whole prompt
    serve_both(seed, count, num_blocks, prefix_caching, max_tokens, whole)


@pytest.mark.parametrize("n", [7, MANY_ROWS + 9])  # Python's few rows, numpy's many
def test_not_plain_decodes_follow_the_rule_row_by_row(n):
    rng = np.random.default_rng(n)
    rows = RequestTable(KVCacheManager(64, BS, False), StopRule([], 100), n)
    rows.requests[:] = make_requests(n, n, [])  # their numbers are set below
    prompt, outputs = rng.integers(1, 20, n), rng.integers(0, 3, n)
    todo = rng.choice([1, 1, 1, 2, 5], n)  # tokens left to compute: mostly decodes
    room = rng.integers(0, 3, n)  # slots left in the blocks; 0: the token needs a block
    # The first row is a decode that needs a block, the last a prefill.
    outputs[0], todo[0], room[0], todo[-1] = 1, 1, 0, 5
    rows.prompt[:], rows.outputs[:] = prompt, outputs
    rows.computed[:] = prompt + outputs - todo
    rows.held[:] = rows.computed + room
    # The rule, one row at a time: a plain decode has one token left, an output before
    # it, and room for it in its blocks.
    rule = list(zip(todo.tolist(), outputs.tolist(), room.tolist(), strict=True))
    others = [i for i, (t, o, r) in enumerate(rule) if not (t == 1 and o > 0 and r > 0)]
    leading = next(k for k, i in enumerate(others) if rule[i][0] != 1 or rule[i][1] == 0)
    assert rows.not_plain_decodes() == (others, leading)


def test_update_refuses_a_plan_it_did_not_schedule():
    sched = build(ChunkedScheduler, [], 8, False, 8)
    sched.add(Request(id="a", index=0, prompt="x", prompt_ids=[1, 2], max_new_tokens=2))
    first = sched.schedule()
    sched.schedule()  # a later plan replaces the first
    with pytest.raises(ValueError, match="the plan the last schedule"):
        sched.update(first, Samples(np.zeros(1, np.int64)), 0.0)
