"""Leaps: a simulated device doing runs of decode steps at once must give exactly what the
same steps one by one give. The oracle is the step-by-step run of the same configuration:
every metric (floats within 1e-9 relative), every token's time, the KV books at the end."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.azure_conversation import write_conversation_trace
from pipeline.executors import build_engine
from pipeline.job.metrics import StepTotals
from pipeline.job.run import run_metrics
from pipeline.job.slo import EarlyVerdict, Slo
from pipeline.plan.capacity import run_probe
from stages.scheduling import run_updates
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import DecodeRun
from stages.scheduling.request_table import RequestTable
from stages.scheduling.run_updates import recurring
from stages.scheduling.stopping import StopRule
from stages.simulator.fast_forward import few_rows_columns, listed_blocks, steps_with_blocks
from tests.helpers import make_config

SIMULATED = ["executor=simulated", "model=spec/llama31_8b"]
ARRIVING = [
    "workload.num_requests=16",
    "workload.rate=40",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=120",
    "workload.min_new_tokens=20",
    "workload.max_new_tokens=60",
    "max_model_len=512",
]


# Requests far enough apart that leaps run past finishes: rows leave the batch mid-leap.
SPREAD = [
    "workload.num_requests=40",
    "workload.rate=10",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=120",
    "workload.min_new_tokens=20",
    "workload.max_new_tokens=120",
    "max_model_len=512",
]


class Leapt:
    """What a run's leaps did: their steps, and how many had a row leave before its end."""

    def __init__(self, totals: StepTotals) -> None:
        self.totals, self.steps, self.leaving, self.heads = totals, StepTotals(), 0, 0

    def __call__(self, run: DecodeRun) -> None:
        self.totals.add_run(run)
        self.steps.add_run(run)
        self.leaving += run.leaving
        self.heads += run.head is not None


def served(overrides: list[str], leaps: bool):
    """The run's metrics, its requests, its engine and what its leaps did."""
    cfg = make_config([*SIMULATED, *overrides])
    engine, requests = build_engine(cfg)
    warmup_s = engine.warmup() if cfg.warmup else 0.0
    totals = StepTotals()
    leapt = Leapt(totals)
    duration = engine.run(requests, on_step=totals.add, on_run=leapt if leaps else None)
    metrics = run_metrics(cfg, engine, requests, totals, duration, warmup_s, "ok")
    return metrics, requests, engine, leapt


def assert_same(a, b, path: str = "metrics") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a} != {b}"


def assert_leaps_change_nothing(overrides: list[str]) -> tuple[dict, Leapt]:
    """Compares the run with leaps against the one without; returns the metrics and what
    the leaps did (so a case shows it exercised them)."""
    alone, alone_requests, alone_engine, none = served(overrides, leaps=False)
    leapt, requests, engine, steps = served(overrides, leaps=True)
    assert none.steps.num_steps == 0
    assert_same(alone, leapt)
    for a, b in zip(alone_requests, requests, strict=True):
        assert (a.id, a.output_ids, a.finish_reason, a.num_preemptions) == (
            b.id,
            b.output_ids,
            b.finish_reason,
            b.num_preemptions,
        )
        assert len(a.token_times) == len(b.token_times)
        assert all(map(math.isclose, a.token_times, b.token_times)), a.id
    books = [(e.scheduler.kv_cache.num_free_blocks, e.model.recompiles, e.model.clock()) for e in
             (alone_engine, engine)]  # fmt: skip
    assert books[0][:2] == books[1][:2] and math.isclose(books[0][2], books[1][2])
    assert kv_books(alone_engine.scheduler.kv_cache) == kv_books(engine.scheduler.kv_cache)
    return leapt, steps


def kv_books(kv: KVCacheManager) -> tuple[int, list[bytes]]:
    """The free blocks, and the cached blocks' contents, least recently used first: what
    the order of a run's takes, registrations and frees decides. (Which block holds what
    may differ: the blocks a run takes at once are numbered otherwise.)"""
    cached = [] if kv.prefix is None else [kv.content_of(b) for b in kv.prefix.unheld]
    return kv.pool.num_free, cached


SLOW = pytest.mark.slow  # each case serves twice; two stay in the quick suite
CASES = [
    pytest.param(["hardware=gaudi3", "warmup=true", *ARRIVING], id="gaudi buckets, warmed"),
    pytest.param(["hardware=gaudi2", *ARRIVING], id="gaudi, compiled while serving", marks=SLOW),
    pytest.param(["hardware=h100", *ARRIVING], id="h100 real lengths", marks=SLOW),
    pytest.param(
        ["hardware=h100", "tp=2", "quantization=fp8", "kv_cache_dtype=fp8", *ARRIVING],
        id="h100 tp=2 fp8",
        marks=SLOW,
    ),  # fmt: skip
    pytest.param(
        ["hardware=h100", *ARRIVING, "workload.concurrency=3"], id="closed loop", marks=SLOW
    ),  # fmt: skip
    pytest.param(
        ["hardware=gaudi3", "scheduler=static", "max_tokens=2048", *ARRIVING],
        id="static batches",
        marks=SLOW,
    ),  # fmt: skip
    pytest.param(
        ["hardware=h100", "num_blocks=24", "max_tokens=64", *ARRIVING], id="tiny pool, preempting"
    ),  # fmt: skip
    pytest.param(
        [
            "hardware=h100",
            "scheduler=whole",
            "scheduler.no_evict=true",
            *ARRIVING,
            "workload.rate=0",
        ],
        id="all at once, whole prompts",
        marks=SLOW,
    ),  # fmt: skip
    pytest.param(["hardware=h100", *SPREAD], id="rows leave mid-leap"),
    pytest.param(
        ["hardware=gaudi2", "metadata.bucketing=exponential", *SPREAD],
        id="rows leave, gaudi buckets shrink and compile",
        marks=SLOW,
    ),  # fmt: skip
    pytest.param(
        ["hardware=h100", "prefix_caching=true", "num_blocks=48", *SPREAD],
        id="rows leave while the prefix cache evicts",
    ),  # fmt: skip
]


@pytest.mark.parametrize("overrides", CASES)
def test_leaps_give_what_steps_one_by_one_give(overrides):
    metrics, steps = assert_leaps_change_nothing(overrides)
    assert steps.heads > 0, "no leap started with the step that admitted its requests"
    if overrides[-1] == SPREAD[-1]:
        assert steps.leaving > 0, "no row left a leap before its end"
    if "num_blocks=24" in overrides:  # preemptions interrupt most runs of decodes
        assert metrics["num_preemptions"] > 0, "no preemption to compare"
        assert steps.steps.num_steps > 10, "too few steps leapt to compare"
    else:
        assert steps.steps.num_steps > metrics["num_steps"] / 4, "too few steps leapt"
    if "hardware=gaudi2" in overrides:
        assert metrics["serving_compiles"] > 0, "no compile during serving to compare"


@SLOW
def test_leaps_keep_the_prefix_cache_as_steps_do():
    overrides = [
        "hardware=h100",
        "workload=multiturn",
        "workload.num_conversations=6",
        "workload.turns=3",
        "workload.rate=2",
        "prefix_caching=true",
        "num_blocks=90",  # cached blocks get evicted
        "max_model_len=1024",
        "max_tokens=512",
    ]
    metrics, steps = assert_leaps_change_nothing(overrides)
    assert steps.steps.num_steps > 0 and metrics["prefix_cache_hit_rate"] > 0


@SLOW
def test_leaps_on_a_conversation_trace(tmp_path):
    trace = tmp_path / "conversation.csv"
    write_conversation_trace(trace, 40, 8.0)
    overrides = ["hardware=h100", "workload=trace", f"workload.path={trace}",
                 "max_model_len=10240", "max_tokens=8192", "metadata.bucketing=exponential",
                 "warmup=true", "max_num_seqs=32"]  # fmt: skip
    metrics, steps = assert_leaps_change_nothing(overrides)
    assert steps.steps.num_steps > metrics["num_steps"] / 2 and steps.leaving > 0


@SLOW
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hardware=st.sampled_from(["h100", "gaudi3"]),
    requests=st.integers(1, 12),
    rate=st.sampled_from([0, 5, 50]),
    block_size=st.sampled_from([16, 32]),
    num_blocks=st.integers(20, 80),
    max_num_seqs=st.integers(1, 8),
    new_tokens=st.integers(1, 60),
    prefix=st.booleans(),
)
def test_leaps_change_nothing_on_small_random_workloads(
    hardware, requests, rate, block_size, num_blocks, max_num_seqs, new_tokens, prefix
):
    assert_leaps_change_nothing([
        f"hardware={hardware}",
        f"workload.num_requests={requests}",
        f"workload.rate={rate}",
        "workload.min_prompt_tokens=1",
        "workload.max_prompt_tokens=100",
        "workload.min_new_tokens=1",
        f"workload.max_new_tokens={new_tokens}",
        f"block_size={block_size}",
        f"num_blocks={num_blocks}",
        f"max_num_seqs={max_num_seqs}",
        "max_model_len=200",
        f"max_tokens={max(block_size, 64)}",
        f"prefix_caching={str(prefix).lower()}",
    ])  # fmt: skip


# An H100 of fixed speed, whatever the shipped profile is fitted to: the SLO below tells
# its requests apart.
FIXED_H100 = [
    "hardware=h100",
    "hardware.gemm_efficiency=0.7",
    "hardware.attention_efficiency=0.6",
    "hardware.memory_efficiency=0.8",
    "hardware.step_overhead_s=0.002",
    "hardware.gemm_fill_s=5e-6",
]


def test_a_metrics_only_probe_leaps_to_the_metrics_of_a_run_with_files(tmp_path):
    slo = ["slo.ttft_ms=200", "slo.tpot_ms=20", "slo.attainment=0.01"]  # never stops it
    cfg = make_config([*SIMULATED, *FIXED_H100, *ARRIVING, *slo])
    with_files = run_probe(cfg, tmp_path / "files", keep_files=True)
    metrics_only = run_probe(cfg, tmp_path / "metrics", keep_files=False)
    assert 0 < with_files["slo_attainment"] < 1  # the SLO tells requests apart
    assert_same(with_files, metrics_only)
    assert (tmp_path / "files" / "steps.jsonl").exists()
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == sorted(
        p.name for p in (tmp_path / "files").iterdir() if p.suffix not in (".jsonl", ".log")
    )


@pytest.mark.parametrize(
    ("slo", "workload"),
    [
        (["slo.ttft_ms=40"], ARRIVING),
        (["slo.tpot_ms=6"], ARRIVING),
        (["slo.e2e_ms=300", "slo.attainment=0.5"], SPREAD),
    ],
    ids=["ttft", "tpot", "e2e, leaps past finishes"],
)
def test_a_probe_stopped_by_its_slo_stops_where_steps_one_by_one_stop(slo, workload):
    stops = []
    for leaps in (False, True):
        cfg = make_config([*SIMULATED, *FIXED_H100, *workload, *slo])
        engine, requests = build_engine(cfg)
        totals = StepTotals()
        verdict = EarlyVerdict(Slo.of(cfg.slo), requests, arrivals_fixed=True)
        leapt = Leapt(totals)
        engine.run(requests, totals.add, verdict.on_finish, leapt if leaps else None, verdict)
        assert verdict.decided_at is not None and verdict.missed_in_flight > 0
        stops.append((engine.clock(), totals.num_steps, [len(r.token_times) for r in requests],
                      verdict.describe()))  # fmt: skip
    assert workload is ARRIVING or leapt.leaving > 0, "no leap ran past a finish"
    assert stops[0][1:] == stops[1][1:] and math.isclose(stops[0][0], stops[1][0])


class StopAtFinish:
    """A stop hook whose answer changes at the run's k-th finish (and at no time)."""

    def __init__(self, k: int) -> None:
        self.k, self.finished = k, 0

    def on_finish(self, request) -> None:
        self.finished += 1

    def __call__(self, now: float) -> bool:
        return self.finished >= self.k

    def next_change(self) -> float:
        return math.inf

    def finishes_before_change(self) -> float:
        return max(0, self.k - self.finished - 1)


@pytest.mark.parametrize("k", [4, 15])
def test_leaps_past_finishes_stop_where_steps_one_by_one_stop(k):
    stops = []
    for leaps in (False, True):
        engine, requests = build_engine(make_config([*SIMULATED, "hardware=h100", *SPREAD]))
        totals, hook = StepTotals(), StopAtFinish(k)
        leapt = Leapt(totals)
        engine.run(requests, totals.add, hook.on_finish, leapt if leaps else None, stop=hook)
        stops.append((engine.clock(), totals.num_steps, [len(r.token_times) for r in requests]))
    assert leapt.leaving > 0, "no leap ran past a finish"
    assert hook.finished < len(requests)  # stopped early
    assert stops[0][1:] == stops[1][1:] and math.isclose(stops[0][0], stops[1][0])


@pytest.mark.parametrize("steps", [1, 5, 16, 17, 70])
def test_recurring_events_come_in_the_order_steps_meet_them(steps):
    rng = np.random.default_rng(steps)
    first = rng.integers(1, 20, size=12)
    rows, at = recurring(first, steps, period=16)
    brute = sorted((s, r) for r in range(12) for s in range(int(first[r]), steps + 1, 16))
    assert list(zip(at.tolist(), rows.tolist(), strict=True)) == brute


@pytest.mark.parametrize("stays", [None, [40, 40, 40, 40, 40], [3, 40, 17, 1, 40]])
@pytest.mark.parametrize("block_size", [16, 64, 1])  # several blocks a row, one at most, each step
def test_listed_blocks_count_each_steps_blocks_row_by_row(stays, block_size):
    lens = np.array([1, 15, 16, 17, 40])
    left = np.array(stays) if stays else None
    blocks = listed_blocks(lens, 40, block_size, left)
    staying = [[j < (stays[i] if stays else 40) for i in range(5)] for j in range(40)]
    by_hand = [sum(math.ceil((n + j) / block_size) for n, on in zip(lens, staying[j], strict=True)
                   if on) for j in range(40)]  # fmt: skip
    assert blocks.tolist() == by_hand


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=12),
    st.integers(1, 40),
    st.sampled_from([1, 4, 16, 128]),
)
def test_a_few_rows_columns_count_what_the_array_rules_count(rows, steps, block_size):
    """The per-step blocks, rows and slots of a few rows, counted row by row in Python,
    against listed_blocks and DecodeRun's own counts from lens and stays (numpy)."""
    lens = np.array([n for n, _ in rows])
    stays = np.minimum([s for _, s in rows], steps)
    blocks, batch, slots = few_rows_columns(lens.tolist(), stays.tolist(), steps, block_size)
    leaves = bool(stays.min() < steps)
    assert (
        blocks.tolist()
        == listed_blocks(lens, steps, block_size, stays if leaves else None).tolist()
    )
    run = DecodeRun([None] * len(rows), lens, stays, blocks, block_size)  # type: ignore[list-item]
    assert (batch is None) == (slots is None) == (not leaves)
    if batch is not None and slots is not None:
        assert batch.tolist() == run.batch.tolist() and slots.tolist() == run.slots().tolist()


def test_a_run_counts_the_rows_and_slots_of_each_step_as_rows_leave():
    lens, stays = np.array([10, 3, 7, 20]), np.array([5, 2, 5, 4])
    run = DecodeRun([None] * 4, lens, stays, np.zeros(5, np.int64), 16)  # type: ignore[list-item]
    on = [[j < s for s in stays] for j in range(5)]
    assert run.batch.tolist() == [sum(row) for row in on] == [4, 4, 3, 3, 2]
    assert run.slots().tolist() == [sum(int(n) + j for n, o in zip(lens, on[j], strict=True) if o)
                                    for j in range(5)]  # fmt: skip
    assert run.num_tokens == int(stays.sum())
    first = run.first(3)
    assert first.batch.tolist() == [4, 4, 3] and first.slots().tolist() == run.slots()[:3].tolist()


def test_a_run_with_a_head_step_counts_that_step_as_the_head_ran_it():
    """Two decoding rows and one that prefills 40 tokens in the head step: the run's
    totals take the head's own for its first step, and only a part that holds the first
    step keeps the head."""
    lens, stays = np.array([10, 20, 40]), np.array([3, 3, 2])
    head = SimpleNamespace(num_tokens=42, padded_tokens=64)  # 40 prefilled + 2 decodes
    run = DecodeRun([None] * 3, lens, stays, np.zeros(3, np.int64), 16, joining=1)  # type: ignore[list-item]
    run = run.padded(np.array([2, 4, 4]), np.array([2, 5, 6]), head)  # type: ignore[arg-type]
    assert run.num_tokens == 42 + 3 + 2  # the head's, then a token per row each step
    assert run.padded_tokens == 64 + 4 + 4
    first, rest = run.first(1), run.first(0)
    assert (first.head, first.joining, first.num_tokens, first.padded_tokens) == (head, 1, 42, 64)
    assert rest.head is None and rest.num_tokens == 0


@pytest.mark.parametrize("stays", [None, [2, 40, 5, 40, 1, 20]])
@pytest.mark.parametrize("limit", [3, 16, 40])
@pytest.mark.parametrize("free", [0, 2, 5, 100])
def test_the_blocks_free_bound_a_run_where_a_step_would_run_short(limit, free, stays):
    rows = RequestTable(KVCacheManager(num_blocks=200, block_size=16), StopRule((), 4096), 6)
    rows.requests[:] = [None] * 6  # rows with numbers only
    rows.computed[:6] = [15, 16, 30, 31, 33, 47]  # tokens whose keys are in the cache
    rows.held[:6] = [16, 16, 32, 32, 48, 48]  # the room their blocks hold: whole blocks
    # Step j (from 1) writes token computed + j - 1: a new block when that reaches held.
    # A row that left (after its `stays` steps) takes nothing more.
    last = stays or [limit] * 6
    taken = [sum((c + j - 1 - h) >= 0 and (c + j - 1 - h) % 16 == 0 and j <= s
                 for c, h, s in zip(rows.computed[:6], rows.held[:6], last, strict=True))
             for j in range(1, limit + 1)]  # fmt: skip
    expected = next((j for j in range(limit) if sum(taken[: j + 1]) > free), limit)
    left = np.array(stays) if stays else None
    assert steps_with_blocks(rows, rows.computed[:6], free, limit, left) == expected


def test_leaps_register_full_blocks_with_and_without_evictions(monkeypatch):
    """A leap keeps two orders with prefix caching: where the free blocks cover its takes,
    every take first and then each full block registered; where a take evicts, the takes,
    registrations and leaving rows step by step. Both give what steps one by one give."""
    evicting, registered, inside = [], [], []
    take_and_register = run_updates.take_and_register
    cache_blocks = KVCacheManager.cache_computed_blocks

    def spy_orders(table, takers, *args):
        evicting.append(len(takers) > 0)
        inside.append(True)
        take_and_register(table, takers, *args)
        inside.pop()

    def spy_registrations(self, request, computed):
        if inside:  # a leap's, at the step that filled the block
            registered.append(evicting[-1])
        cache_blocks(self, request, computed)

    monkeypatch.setattr(run_updates, "take_and_register", spy_orders)
    monkeypatch.setattr(KVCacheManager, "cache_computed_blocks", spy_registrations)
    assert_leaps_change_nothing(["hardware=h100", "prefix_caching=true", "num_blocks=48", *SPREAD])
    assert set(registered) == {True, False}, "a leap registering blocks in each order"
