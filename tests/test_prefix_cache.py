"""Prefix caching: the KV-cache manager's block states, and tokens equal to the dense oracle."""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.executors import build_engine
from pipeline.schema import ChunkedSchedulerConf
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.prefix_cache import UnnamedBlocks
from stages.scheduling.request import Request, Samples
from stages.scheduling.scheduler import ChunkedScheduler
from stages.scheduling.stopping import StopRule
from stages.trace import PromptIdSource, SeededPromptIds
from stages.trace.prompt_ids import PREFIX_KEY
from tests.helpers import make_config, schema_kwargs, serve

BS = 4


def request(i: int, ids: list[int], new: int = 3) -> Request:
    return Request(id=f"r{i}", index=i, prompt="x", prompt_ids=list(ids), max_new_tokens=new)


def computed(kv: KVCacheManager, r: Request) -> None:
    """Allocates and 'computes' the whole prompt of r, then lets it go: its full blocks stay."""
    assert kv.allocate_slots(r, len(r.prompt_ids), computed=0)
    kv.cache_computed_blocks(r, len(r.prompt_ids))
    kv.free(r)


def test_a_cached_prefix_is_found_in_whole_blocks_leaving_the_last_token():
    kv = KVCacheManager(16, BS, prefix_caching=True)
    computed(kv, request(0, range(10)))  # blocks [0-3], [4-7] full; [8, 9] is not cached
    assert len(kv.match_prefix(request(1, range(10)))) == 2
    assert len(kv.match_prefix(request(2, [*range(9), 99]))) == 2
    # A prompt of exactly two cached blocks recomputes its last block, so it has logits.
    assert len(kv.match_prefix(request(3, range(8)))) == 1
    assert len(kv.match_prefix(request(4, range(7)))) == 1


def test_two_prompts_differing_in_one_token_of_the_first_block_share_nothing():
    kv = KVCacheManager(16, BS, prefix_caching=True)
    computed(kv, request(0, range(12)))
    other = list(range(12))
    other[1] = 77
    assert kv.match_prefix(request(1, other)) == []
    # The hash covers the parent: the same second block after another first one is no match.
    assert kv.match_prefix(request(2, [50, 51, 52, 53, *range(4, 12)])) == []


def test_cached_blocks_are_evicted_least_recently_used_only_when_no_block_is_free():
    kv = KVCacheManager(4, BS, prefix_caching=True)
    first, second = request(0, range(5)), request(1, range(100, 105))
    computed(kv, first)  # caches block 0
    computed(kv, second)  # caches block 1; blocks 2, 3 were never used
    assert kv.num_free_blocks == 4
    taker = request(2, range(200, 215))
    assert kv.allocate_slots(taker, 8, computed=0)  # takes the two free blocks first
    assert len(kv.match_prefix(request(3, range(5)))) == 1
    assert kv.allocate_slots(taker, 12, computed=0)  # one more block: the older cached one goes
    assert kv.match_prefix(request(4, range(5))) == []
    assert len(kv.match_prefix(request(5, range(100, 105)))) == 1


def test_a_block_held_by_two_requests_is_freed_by_neither_alone():
    kv = KVCacheManager(8, BS, prefix_caching=True)
    computed(kv, request(0, range(9)))
    a, b = request(1, range(9)), request(2, range(9))
    for r in (a, b):
        cached = kv.match_prefix(r)
        assert kv.allocate_slots(r, 1, cached, computed=len(cached) * BS)
    shared = kv.block_table(a)[:2]
    assert shared == kv.block_table(b)[:2]
    kv.free(a)
    assert all(kv.prefix.refs[block] == 1 for block in shared)
    assert not set(shared) & set(kv.prefix.unheld)
    kv.free(b)
    assert set(shared) <= set(kv.prefix.unheld)


# ---------------------------------------------------------------------------------------------
# Property: any workload with shared prefixes keeps every block in exactly one state.


def check_blocks(sched: ChunkedScheduler) -> None:
    kv = sched.kv_cache
    prefix = kv.prefix
    holders: dict[int, int] = {}
    for r in sched.running:
        for block in kv.block_table(r):
            holders[block] = holders.get(block, 0) + 1
    free = set(kv.pool._free)
    for block in range(kv.num_blocks):
        assert prefix.refs[block] >= 0
        assert prefix.refs[block] == holders.get(block, 0), "a reference count is off"
        states = [block in free, block in prefix.unheld, prefix.refs[block] > 0]
        assert sum(states) == 1, f"block {block} is in {states} (free, cached, held)"
        if block in prefix.unheld:
            assert prefix.hash_of[block] is not None


def check_writes(sched: ChunkedScheduler, plan) -> None:
    """Every slot the step writes is in a block only its writer holds and whose content is
    not cached yet: a cached or shared block is never written again."""
    kv = sched.kv_cache
    rows = [(c.request, range(c.start, c.end)) for c in plan.prefill]
    rows += [(r, range(r.num_tokens - 1, r.num_tokens)) for r in plan.decode]  # its last
    for r, positions in rows:
        table = kv.block_table(r)
        for pos in positions:
            block = table[pos // kv.block_size]
            assert kv.prefix.refs[block] == 1, "a shared block is written"
            assert kv.prefix.hash_of[block] is None, "a cached block is written"


@settings(max_examples=80, deadline=None)
@given(
    num_prefixes=st.integers(1, 3),
    prefix_blocks=st.integers(0, 4),
    tails=st.lists(st.integers(1, 12), min_size=1, max_size=10),
    new=st.integers(1, 8),
    budget_blocks=st.integers(1, 6),
    pool_slack=st.integers(0, 12),
    seed=st.integers(0, 1000),
)
def test_block_states_hold_for_any_workload_with_shared_prefixes(
    num_prefixes, prefix_blocks, tails, new, budget_blocks, pool_slack, seed
):
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 50, prefix_blocks * BS).tolist() for _ in range(num_prefixes)]
    reqs = [
        request(i, prefixes[i % num_prefixes] + rng.integers(0, 50, tail).tolist(), new)
        for i, tail in enumerate(tails)
    ]
    longest = max(len(r.prompt_ids) + new for r in reqs)
    kv = KVCacheManager(-(-longest // BS) + pool_slack, BS, prefix_caching=True)
    limits = {"max_tokens": budget_blocks * BS, "max_num_seqs": 4, "max_model_len": 10_000}
    given = schema_kwargs(ChunkedSchedulerConf, **limits)
    sched = ChunkedScheduler(kv_cache=kv, stop=StopRule((), 10_000), **given)
    for r in reqs:
        sched.add(r)
    for _ in range(5_000):
        if not sched.has_work:
            break
        plan = sched.schedule()
        check_writes(sched, plan)
        tokens = rng.integers(0, 50, len(plan.sampled_requests))
        sched.update(plan, Samples(tokens.astype(np.int64)), 0.0)
        check_blocks(sched)
    assert not sched.has_work, "the scheduler did not finish"
    assert all(len(r.output_ids) == new for r in reqs)
    assert kv.num_free_blocks == kv.num_blocks, "at the end every block is free or cached"
    check_blocks(sched)


def books(kv: KVCacheManager) -> tuple:
    """The prefix cache's books, a block registered unnamed shown by its request and place
    (the objects that hold them differ between runs)."""
    p = kv.prefix
    contents = [
        (c.request.id, c.place[b]) if isinstance(c, UnnamedBlocks) else c
        for b, c in enumerate(p.hash_of)
    ]
    return dict(p.block_of), contents, list(p.unheld), list(p.refs)


class RegistersEveryBlock(KVCacheManager):
    """The plain rule: a request registers all its full blocks from its first, those its
    cached prefix gave it included (registering a known content changes nothing)."""

    def allocate_slots(self, request, num_new_tokens, cached=(), *, computed):
        taken = super().allocate_slots(request, num_new_tokens, cached, computed=computed)
        self._registered.pop(request.seq_id, None)
        return taken


@settings(max_examples=30, deadline=None)
@given(tails=st.lists(st.integers(1, 12), min_size=2, max_size=8), seed=st.integers(0, 1000))
def test_a_cached_prefix_is_not_registered_again_and_the_cache_is_the_same(tails, seed):
    """Admission counts a cached prefix's blocks as registered; the cache (contents, LRU
    order, holders) equals the plain rule's after every step."""
    caches = []
    for kv_class in (KVCacheManager, RegistersEveryBlock):
        rng = np.random.default_rng(seed)
        prefix = rng.integers(0, 50, 3 * BS).tolist()
        reqs = [
            request(i, prefix + rng.integers(0, 50, t).tolist(), 3) for i, t in enumerate(tails)
        ]
        kv = kv_class(-(-(3 * BS + 12 + 3) // BS) + 6, BS, prefix_caching=True)
        limits = {"max_tokens": 2 * BS, "max_num_seqs": 2, "max_model_len": 10_000}
        given = schema_kwargs(ChunkedSchedulerConf, **limits)
        sched = ChunkedScheduler(kv_cache=kv, stop=StopRule((), 10_000), **given)
        states = []
        for r in reqs:
            sched.add(r)
        while sched.has_work:
            plan = sched.schedule()
            sched.update(plan, Samples(np.zeros(len(plan.sampled_requests), np.int64)), 0.0)
            states.append(books(kv))
            assert len(states) < 2_000, "the scheduler did not finish"
        caches.append(states)
    assert caches[0] == caches[1]
    assert any(r.cached_tokens for r in reqs), "some request found a cached prefix"


# ---------------------------------------------------------------------------------------------
# Tokens: caching on equals caching off equals the dense oracle.

SHARED = [
    "workload.num_requests=8",
    "workload.shared_prefix_tokens=150",  # more than a block of 128
    "workload.num_prefixes=2",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=40",
    "workload.min_new_tokens=4",
    "workload.max_new_tokens=12",
]
ORACLE = ["attention=reference", "scheduler=whole", "max_tokens=4096"]


@functools.lru_cache(maxsize=4)
def oracle(workload: tuple[str, ...]) -> dict[str, Request]:
    """The dense oracle's requests on the same workload (arrival rates change the prompts
    drawn, so each workload gets its own)."""
    return serve([*SHARED, *workload, *ORACLE])[0]


CASES = {
    "block 16, budget of one block": ["max_tokens=16"],
    "block 16, budget 64": ["max_tokens=64"],
    # A large budget admits every request in the first step, before anything is cached:
    # arrivals spread out give later requests a cached prefix.
    "block 16, budget 4096": ["max_tokens=4096", "workload.rate=20"],
    "block 128, budget 128": ["block_size=128", "max_tokens=128"],
    "block 128, budget 4096": ["block_size=128", "max_tokens=4096", "workload.rate=20"],
    "preemption by a small pool": ["max_tokens=32", "num_blocks=20"],
    "arrivals while the prefix is computed": ["max_tokens=16", "workload.rate=200"],
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_cached_prefixes_give_the_oracle_tokens(overrides):
    want_by_id = oracle(tuple(o for o in overrides if o.startswith("workload.")))
    got, engine = serve([*SHARED, *overrides])
    assert engine.scheduler.kv_cache.prefix is not None
    assert sum(r.cached_tokens for r in got.values()) > 0, "no prefix was reused"
    for rid, want in want_by_id.items():
        assert got[rid].output_ids == want.output_ids, rid
    off, _ = serve([*SHARED, *overrides, "prefix_caching=false"])
    assert all(off[rid].output_ids == want.output_ids for rid, want in want_by_id.items())
    assert all(r.cached_tokens == 0 for r in off.values())


def test_preemption_keeps_cached_blocks_for_the_recompute():
    steps = []
    got, engine = serve([*SHARED, "max_tokens=32", "num_blocks=20"], steps=steps)
    assert sum(r.num_preemptions for r in got.values()) > 0, "the pool did not preempt"
    readmitted = [c for s in steps for c in s.prefill if c["cached"] and c["start"] > 0]
    assert readmitted, "no admission started after a cached prefix"
    assert engine.scheduler.kv_cache.num_free_blocks == 20


# ---------------------------------------------------------------------------------------------
# A trace's drawn prompts: blocks known by the prompt's name, not by hashing drawn ids.


def drawn(source: PromptIdSource, line: int, length: int, outputs: list[int]) -> Request:
    ids = SeededPromptIds(length, line, source)
    r = Request(id=f"l{line}", index=line, prompt="x", prompt_ids=ids, max_new_tokens=50)
    r.output_ids = list(outputs)
    return r


def test_named_blocks_are_equal_exactly_when_their_prefixes_are():
    source = PromptIdSource(np.arange(1000), seed=1, block_size=16, capacity=8)
    kv = KVCacheManager(64, BS, prefix_caching=True)
    whole = drawn(source, 3, 14, [5, 6])  # blocks [0-3], [4-7], [8-11]; [12, 13, 5, 6]
    shorter = drawn(source, 3, 10, [5, 6])  # the same row clipped: [8, 9, 5, 6] differs
    other_out = drawn(source, 3, 10, [6, 6])
    other_row = drawn(source, 4, 14, [5, 6])
    other_seed = drawn(PromptIdSource(np.arange(1000), 2, 16, 8), 3, 14, [5, 6])
    requests = [whole, shorter, other_out, other_row, other_seed]
    names = [kv.block_hashes(r, r.num_tokens // BS) for r in requests]
    assert [len(n) for n in names] == [4, 3, 3, 4, 4]
    assert names[0][:2] == names[1][:2] == names[2][:2]
    assert all(r.prompt_ids._array is None for r in requests)  # named, not drawn
    # The oracle: two blocks share a name exactly when their whole prefixes' ids are equal.
    for r, chain in zip(requests, names, strict=True):
        for s, other in zip(requests, names, strict=True):
            for j, name in enumerate(chain):
                for k, name_other in enumerate(other):
                    same_ids = j == k and list(r.all_ids[: (j + 1) * BS]) == list(
                        s.all_ids[: (k + 1) * BS]
                    )
                    assert (name == name_other) == same_ids, (r.id, j, s.id, k)


def test_output_blocks_are_hashed_by_their_ids_however_often_a_token_repeats():
    """A decode's block (one token repeated, as a simulated device samples, or not) and the
    block a drawn prompt ends in get the hash an independent blake2b of the int32 ids
    gives: blocks of one token packed once are cut, never reused for another token."""

    def content(parent: bytes, ids: list[int], person: bytes = b"") -> bytes:
        data = parent + np.asarray(ids, dtype=np.int32).tobytes()
        return hashlib.blake2b(data, digest_size=16, person=person).digest()

    outputs = [7] * 9 + [8] * 8 + [7, 8, 7, 8] + [7] * 5  # a list prompt of 6: 8 blocks
    source = PromptIdSource(np.arange(1000), seed=1, block_size=BS, capacity=8)
    for prompt in ([1, 2, 3, 4, 5, 6], SeededPromptIds(6, 3, source)):
        r = Request(id="r", index=0, prompt="x", prompt_ids=prompt, max_new_tokens=50)
        r.output_ids = list(outputs)
        kv = KVCacheManager(64, BS, prefix_caching=True)
        ids = [*prompt, *outputs]
        if isinstance(prompt, list):
            expected = [content(b"", ids[:BS])]
        else:  # whole blocks by name; the one the prompt ends in from its name and outputs
            named = [PREFIX_KEY.pack(source.tag, 3, n) for n in (4, 6)]
            expected = [named[0], content(named[1], outputs[:2], b"named prompt")]
        for j in range(len(expected), len(ids) // BS):
            expected.append(content(expected[-1], ids[j * BS : (j + 1) * BS]))
        # Asked a block at a time, as decodes fill them, and all at once.
        assert [kv.block_hashes(r, j)[-1] for j in range(1, 9)] == expected
        r.block_hashes = []
        assert kv.block_hashes(r, 8) == expected


def test_a_drawn_prompt_finds_its_cached_prefix_and_mooncake_hash_ids_still_hit():
    source = PromptIdSource(np.arange(7), seed=1, block_size=BS, capacity=8)
    kv = KVCacheManager(64, BS, prefix_caching=True)
    computed(kv, drawn(source, 3, 14, []))
    assert len(kv.match_prefix(drawn(source, 3, 14, [1]))) == 3
    assert len(kv.match_prefix(drawn(source, 3, 9, []))) == 2
    assert kv.match_prefix(drawn(source, 4, 14, [])) == []
    mooncake = [SeededPromptIds(12, (line, (7, 8, 9)), source) for line in (0, 1)]
    first, second = (Request(f"m{i}", i, "x", ids, 3) for i, ids in enumerate(mooncake))
    computed(kv, first)
    assert len(kv.match_prefix(second)) == 2  # another row, the same hash ids: a hit


def as_plain_lists(requests: list[Request]) -> None:
    for r in requests:
        r.prompt_ids = list(r.prompt_ids)


@pytest.mark.parametrize("executor", ["paddle", "simulated"])
def test_named_blocks_schedule_as_content_hashes_do(tmp_path, executor):
    """A trace served with preemption and prefix caching: its prompts named, or the same ids
    as plain lists (hashed by content), give the same steps and the same cache hits."""
    rows = "\n".join(f"0,{40 + 13 * (i % 5)},{6 + i % 7}" for i in range(14))
    path = tmp_path / "vidur.csv"
    path.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n{rows}\n")
    overrides = [
        "workload=trace",
        f"workload.path={path}",
        "max_tokens=64",
        "num_blocks=12",
        f"executor={executor}",
        *(["hardware=gaudi3"] if executor == "simulated" else []),
    ]
    runs = []
    for plain in (False, True):
        engine, requests = build_engine(make_config([*overrides, "block_size=16"]))
        if plain:
            as_plain_lists(requests)
        steps: list = []
        engine.run(requests, on_step=steps.append)
        runs.append((steps, requests))
    (named_steps, named), (plain_steps, plain) = runs
    assert sum(r.num_preemptions for r in named) > 0, "the pool did not preempt"
    hits = [c for s in named_steps for c in s.prefill if c["cached"]]
    assert hits, "no admission reused a cached prefix"
    assert [vars(s) | {"duration_s": 0} for s in named_steps] == [
        vars(s) | {"duration_s": 0} for s in plain_steps
    ]
    assert [(r.output_ids, r.cached_tokens) for r in named] == [
        (r.output_ids, r.cached_tokens) for r in plain
    ]
    if executor == "simulated":
        assert all(r.prompt_ids._array is None for r in named)  # nothing was drawn
