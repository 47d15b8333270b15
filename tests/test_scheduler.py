"""Scheduler invariants, driven without a model: tokens are fed back by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import ChunkedSchedulerConf, WholeSchedulerConf
from stages.scheduling.admission import Admission
from stages.scheduling.kv_cache import KVCacheManager, blocks_for
from stages.scheduling.request import Request, Samples
from stages.scheduling.scheduler import ChunkedScheduler
from stages.scheduling.stopping import StopRule
from stages.scheduling.whole_prompt import WholeScheduler
from tests.helpers import schema_kwargs


def request(i: int, prompt_len: int, new: int = 4) -> Request:
    return Request(id=f"r{i}", index=i, prompt="x", prompt_ids=[1] * prompt_len, max_new_tokens=new)


def scheduler(**kw) -> ChunkedScheduler:
    args = dict(max_tokens=1024, max_num_seqs=64, max_model_len=100_000, block_size=16)
    args.update(kw)
    args.setdefault("num_blocks", 10_000)
    cls = args.pop("cls", ChunkedScheduler)
    kv_cache = KVCacheManager(args.pop("num_blocks"), args.pop("block_size"))
    stop = StopRule((), args["max_model_len"])
    conf = WholeSchedulerConf if issubclass(cls, WholeScheduler) else ChunkedSchedulerConf
    return cls(kv_cache=kv_cache, stop=stop, **schema_kwargs(conf, **args))


def sevens(rows: int) -> Samples:
    """Token 7 for every row: no stage here looks at the values."""
    return Samples(np.full(rows, 7, dtype=np.int64))


def drive(sched: ChunkedScheduler, requests: list[Request], max_steps: int = 100_000):
    """Serves everything, checking the per-step invariants; returns the plans."""
    for r in requests:
        reason = sched.rejection(r)
        if reason:
            r.fail(reason, 0.0)
        else:
            sched.add(r)
    plans = []
    while sched.has_work:
        assert len(plans) < max_steps, "the scheduler did not progress"
        plan = sched.schedule()
        assert not plan.empty or plan.failed
        assert plan.num_tokens <= sched.max_tokens
        if plan.prefill:
            blocks = [blocks_for(c.length, sched.block_size) for c in plan.prefill]
            if sched.padded_budget:
                # The padded step, what the device computes, fits the budget too.
                padded = len(blocks) * max(blocks) * sched.block_size + len(plan.decode)
                assert padded <= sched.max_tokens
            # Rows beyond the first pad the rectangle at most by max_padding.
            assert sum(blocks) >= (1 - sched.chunks.max_padding) * len(blocks) * max(blocks) - 1e-9
        assert len(plan.prefill) + len(plan.decode) <= sched.max_num_seqs
        owners = {}
        kv = sched.kv_cache
        for r, computed in zip(sched.running, sched.table.computed.tolist(), strict=False):
            for b in kv.block_table(r):
                assert b not in owners, "a block is shared"
                owners[b] = r.id
            assert len(kv.block_table(r)) >= blocks_for(computed, sched.block_size)
        assert len(owners) + kv.num_free_blocks == kv.num_blocks
        for chunk in plan.prefill:
            if sched.chunks.align_chunks and not chunk.is_final:
                assert chunk.length % sched.block_size == 0
                assert chunk.start % sched.block_size == 0
        sched.update(plan, sevens(len(plan.sampled_requests)), 0.0)
        plans.append(plan)
    assert sched.kv_cache.num_free_blocks == sched.kv_cache.num_blocks, "blocks leaked"
    for r in requests:
        assert r.finished
        assert r.error is not None or len(r.output_ids) == r.max_new_tokens
    return plans


def test_vllm_unit_case_three_800_token_prompts_budget_1024():
    sched = scheduler(align_chunks=False, budget="real", max_padding=1.0)
    reqs = [request(i, 800) for i in range(3)]
    for r in reqs:
        sched.add(r)
    plan = sched.schedule()
    assert [(c.request.id, c.length) for c in plan.prefill] == [("r0", 800), ("r1", 224)]
    assert reqs[2] in sched.waiting


def test_reference_hang_case_finishes():
    """Budget 4096, decodes running, a chunk leaving less than a block, a long prompt waiting."""
    sched = scheduler(max_tokens=4096, block_size=128)
    decoding = [request(i, 10, new=50) for i in range(5)]
    for r in decoding:
        sched.add(r)
    sched.update(sched.schedule(), sevens(5), 0.0)  # all five now decode
    partial = request(5, 4100)  # 4091 left after 5 decodes, cut to 3968: 123 left, below a block
    long = request(6, 9000)
    for r in (partial, long):
        sched.add(r)
    plan = sched.schedule()
    assert [c.length for c in plan.prefill] == [3968]  # aligned down; the long one waits
    assert len(plan.decode) == 5
    drive(sched, [])  # the remaining work finishes, in bounded steps
    assert partial.finished and long.finished


@pytest.mark.parametrize(("budget", "second_chunk"), [("padded", 32), ("real", 48)])
def test_short_remaining_prompt_waits_rather_than_misalign(budget, second_chunk):
    sched = scheduler(max_tokens=64, block_size=16, budget=budget, max_padding=1.0)
    r = request(0, 70)
    sched.add(r)
    first = sched.schedule()
    assert first.prefill[0].length == 64
    sched.update(first, sevens(1), 0.0)
    r2 = request(1, 100)
    sched.add(r2)
    second = sched.schedule()
    # r finishes its prompt (6 tokens, final, unaligned is fine); r2 gets aligned tokens:
    # all 48 left when real tokens count, 32 when r's row costs a whole block and both
    # rows are padded to r2's width (2 x 32 = 64).
    assert [(c.request.id, c.start, c.length) for c in second.prefill] == [
        ("r0", 64, 6),
        ("r1", 0, second_chunk),
    ]


def test_a_short_row_waits_rather_than_pad_a_wide_rectangle():
    """Beside a 512-token chunk a 40-token prompt would leave the rectangle 44% padding."""
    sched = scheduler(max_tokens=2048, block_size=32, max_padding=0.25)
    for i, n in enumerate((512, 40, 480)):
        sched.add(request(i, n))
    first = sched.schedule()
    assert [c.length for c in first.prefill] == [512]
    sched.update(first, sevens(1), 0.0)
    second = sched.schedule()  # the short prompt now comes first and sets a narrow width
    assert [(c.request.id, c.length) for c in second.prefill] == [("r1", 40)]
    lenient = scheduler(max_tokens=2048, block_size=32, max_padding=1.0)
    for i, n in enumerate((512, 40, 480)):
        lenient.add(request(i, n))
    assert [c.length for c in lenient.schedule().prefill] == [512, 40, 480]


def test_padded_budget_keeps_short_rows_out_of_a_wide_rectangle():
    """A 300-token chunk makes the rectangle 320 wide; a 10-token prompt would cost 320."""
    sched = scheduler(max_tokens=512, block_size=32, max_padding=1.0)
    for i, n in enumerate((300, 10)):
        sched.add(request(i, n))
    plan = sched.schedule()
    assert [c.length for c in plan.prefill] == [300]
    real = scheduler(max_tokens=512, block_size=32, budget="real", max_padding=1.0)
    for i, n in enumerate((300, 10)):
        real.add(request(i, n))
    assert [c.length for c in real.schedule().prefill] == [300, 10]


def test_long_prefill_threshold_caps_a_chunk():
    sched = scheduler(max_tokens=1024, long_prefill_threshold=256, max_padding=1.0)
    sched.add(request(0, 1000))
    sched.add(request(1, 30))
    plan = sched.schedule()
    assert [c.length for c in plan.prefill] == [256, 30]


def test_preemption_frees_the_newest_and_everything_finishes():
    sched = scheduler(max_tokens=64, block_size=16, num_blocks=12)
    reqs = [request(i, 40, new=60) for i in range(4)]  # 100 tokens = 7 blocks each at the end
    plans = drive(sched, reqs)
    assert sum(len(p.preempted) for p in plans) > 0
    assert sum(r.num_preemptions for r in reqs) > 0


def test_requests_that_can_never_run_get_their_own_error():
    sched = scheduler(max_model_len=64, num_blocks=3)
    ok = request(0, 10)
    too_long = request(1, 64)
    too_big = request(2, 40, new=20)  # 60 tokens: 4 blocks, the pool has 3
    no_output = request(3, 5, new=0)
    empty = request(4, 1)
    empty.prompt, empty.prompt_ids = "", []
    drive(sched, [ok, too_long, too_big, no_output, empty])
    assert ok.error is None and len(ok.output_ids) == 4
    assert "max_model_len=64" in too_long.error
    assert "num_blocks=3" in too_big.error
    assert "max_new_tokens=0" in no_output.error
    assert empty.error == "empty prompt"


def test_whole_scheduler_refuses_a_prompt_over_the_budget():
    sched = scheduler(cls=WholeScheduler, max_tokens=64)
    big, small = request(0, 65), request(1, 64)
    plans = drive(sched, [big, small])
    assert "max_tokens=64" in big.error and small.error is None
    assert plans[0].prefill[0].length == 64


@settings(max_examples=120, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 300), min_size=1, max_size=12),
    new=st.lists(st.integers(1, 20), min_size=12, max_size=12),
    block_size=st.sampled_from([1, 4, 16, 64]),
    budget_blocks=st.integers(1, 8),
    extra_budget=st.integers(0, 63),
    max_num_seqs=st.integers(1, 8),
    pool_slack=st.integers(0, 40),
    align=st.booleans(),
    threshold_blocks=st.integers(0, 4),
    whole=st.booleans(),
    budget=st.sampled_from(["padded", "real"]),
    max_padding=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_invariants_hold_for_any_workload(
    prompts, new, block_size, budget_blocks, extra_budget, max_num_seqs, pool_slack, align,
    threshold_blocks, whole, budget, max_padding,
):  # fmt: skip
    max_tokens = max(budget_blocks * block_size + extra_budget, max_num_seqs)
    reqs = [request(i, p, new[i]) for i, p in enumerate(prompts)]
    biggest = max(blocks_for(p + n, block_size) for p, n in zip(prompts, new, strict=False))
    sched = scheduler(
        cls=WholeScheduler if whole else ChunkedScheduler,
        max_tokens=max_tokens,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        num_blocks=biggest + pool_slack,
        budget=budget,
        max_padding=max_padding,
        **(
            {}
            if whole
            else {"align_chunks": align, "long_prefill_threshold": threshold_blocks * block_size}
        ),
    )
    drive(sched, reqs, max_steps=20_000)


@pytest.mark.parametrize("cap", [1, 3])
def test_max_prefill_rows_caps_the_prompts_of_a_step(cap):
    # 8 prompts of one block each fit one step of 1024 tokens: 8 rows uncapped, `cap`
    # with the cap (FastDeploy's MAX_PREFILL_NUM), and every prompt is still served
    requests = [request(i, 16) for i in range(8)]
    plans = drive(scheduler(max_prefill_rows=cap), requests)
    assert max(len(p.prefill) for p in plans) == cap
    assert all(r.finished and not r.error for r in requests)
    assert max(len(p.prefill) for p in drive(scheduler(), [request(i, 16) for i in range(8)])) == 8


@pytest.mark.parametrize(("cost", "decoding"), [(1, 5), (8, 5), (9, 4), (16, 2)])
def test_a_decode_row_costs_the_budget_its_decode_tokens(cost, decoding):
    """Five requests decoding under a 40-token budget (their prompts all prefilled in the
    first step): a row costs `cost` tokens (a speculative verification's k + 1), so
    min(5, 40 // cost) of them decode in a step, by hand."""
    kv_cache = KVCacheManager(1000, 4)
    conf = schema_kwargs(ChunkedSchedulerConf, max_tokens=40, max_num_seqs=8, max_model_len=64)
    sched = ChunkedScheduler(kv_cache=kv_cache, stop=StopRule((), 64), decode_tokens=cost, **conf)
    for i in range(5):
        sched.add(request(i, 4, new=20))
    while any(not r.output_ids for r in [*sched.waiting, *sched.running]):
        plan = sched.schedule()
        sched.update(plan, sevens(len(plan.sampled_requests)), 0.0)
    plan = sched.schedule()
    assert not plan.prefill and len(plan.decode) == decoding
    assert len(plan.decode) * cost <= 40


def test_a_decode_row_costs_one_token_or_more():
    conf = schema_kwargs(ChunkedSchedulerConf, max_tokens=16, max_num_seqs=8, max_model_len=64)
    with pytest.raises(ValueError, match="decode_tokens=0"):
        ChunkedScheduler(
            kv_cache=KVCacheManager(10, 4), stop=StopRule((), 64), decode_tokens=0, **conf
        )


def order_steps(step_order: str) -> list[tuple[list[tuple[str, int, int]], list[str]]]:
    """A (6-token prompt) served; then B (10 tokens) arrives while A decodes: each step's
    prefill chunks (request, start, end) and decode rows, under an 8-token budget with
    4-token blocks (non-final chunks whole blocks)."""
    conf = schema_kwargs(ChunkedSchedulerConf, max_tokens=8, max_num_seqs=8, max_model_len=64,
                         budget="real", step_order=step_order)  # fmt: skip
    sched = ChunkedScheduler(kv_cache=KVCacheManager(100, 4), stop=StopRule((), 64), **conf)
    a, b = request(0, 6, new=4), request(1, 10, new=2)
    sched.add(a)
    steps = []
    for i in range(5):
        if i == 1:
            sched.add(b)
        plan = sched.schedule()
        steps.append(([(c.request.id, c.start, c.end) for c in plan.prefill],
                      [r.id for r in plan.decode]))  # fmt: skip
        sched.update(plan, sevens(len(plan.sampled_requests)), 0.0)
    return steps


def test_prefill_first_gives_prompts_steps_of_their_own():
    # SGLang's order, by hand: B's chunks run alone while A waits (8 tokens, then the last
    # 2, which samples B's first token), then both decode (B's second and last token);
    # A's decode rows rejoin only once no prompt is left
    assert order_steps("prefill_first") == [
        ([("r0", 0, 6)], []),
        ([("r1", 0, 8)], []),
        ([("r1", 8, 10)], []),
        ([], ["r0", "r1"]),
        ([], ["r0"]),
    ]
    # decode first (vLLM's, FastDeploy's): A decodes beside B's chunks, which get the 7
    # tokens left, cut to whole blocks (4), then the 6 left; A's fourth token and B's
    # second end both in step 4, leaving step 5 nothing
    assert order_steps("decode_first") == [
        ([("r0", 0, 6)], []),
        ([("r1", 0, 4)], ["r0"]),
        ([("r1", 4, 10)], ["r0"]),
        ([], ["r0", "r1"]),
        ([], []),
    ]


def test_the_scheduler_is_one_class_that_owns_its_admission():
    # policy by composition: no base class reaching into the scheduler's state
    assert ChunkedScheduler.__bases__ == (object,)
    assert not issubclass(ChunkedScheduler, Admission)
