"""The KV-cache manager with prefix caching against a plain model of it: every block named
by its whole prefix's ids as soon as it is full, a sorted free list and an LRU list. The
manager names a block only when another request could find or clash with it; whatever
the order of admissions, decodes, preemptions and finishes, both take the same blocks,
find the same prefixes and keep the same LRU order."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request

BS = 4


class PlainCache:
    """The rules, written the simplest way: names are tuples of ids, made eagerly."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = list(range(num_blocks))  # free blocks, the lowest taken first
        self.lru: list[int] = []  # cached blocks nobody holds, oldest first
        self.holders = [0] * num_blocks
        self.name_of: dict[int, tuple[int, ...]] = {}
        self.block_of: dict[tuple[int, ...], int] = {}
        self.tables: dict[str, list[int]] = {}
        self.registered: dict[str, int] = {}

    def match(self, ids: list[int]) -> list[int]:
        blocks = []
        for j in range((len(ids) - 1) // BS):
            block = self.block_of.get(tuple(ids[: (j + 1) * BS]))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def allocate(self, name: str, total: int, cached: list[int]) -> bool:
        held = len(self.tables.get(name, []))
        new = -(-total // BS) - held - len(cached)
        if new <= 0 and not cached:
            return True
        new = max(new, 0)
        if new > len(self.pool) + len(self.lru) - sum(b in self.lru for b in cached):
            return False
        table = self.tables.setdefault(name, [])
        for block in cached:
            self.holders[block] += 1
            if block in self.lru:
                self.lru.remove(block)
        if cached:
            self.registered[name] = len(cached)
        table += cached
        for _ in range(new):
            if self.pool:
                block = min(self.pool)
                self.pool.remove(block)
            else:
                block = self.lru.pop(0)
                del self.block_of[self.name_of.pop(block)]
            self.holders[block] = 1
            table.append(block)
        return True

    def register(self, name: str, ids: list[int]) -> None:
        table = self.tables[name]
        full = min(len(ids) // BS, len(table))
        for j in range(self.registered.get(name, 0), full):
            content, block = tuple(ids[: (j + 1) * BS]), table[j]
            if content not in self.block_of and block not in self.name_of:
                self.block_of[content] = block
                self.name_of[block] = content
        self.registered[name] = max(full, self.registered.get(name, 0))

    def free(self, name: str) -> None:
        for block in self.tables.pop(name, []):
            self.holders[block] -= 1
            if not self.holders[block]:
                (self.lru if block in self.name_of else self.pool).append(block)
        self.registered.pop(name, None)


def admit(kv: KVCacheManager, plain: PlainCache, r: Request) -> bool:
    """Admission as the scheduler does it: the cached prefix, then room for the rest."""
    ids = [*r.prompt_ids, *r.output_ids]
    cached = kv.match_prefix(r)
    assert cached == plain.match(ids), "a different cached prefix"
    computed = len(cached) * BS
    taken = kv.allocate_slots(r, len(ids) - computed, cached, computed=computed)
    assert taken == plain.allocate(r.id, len(ids), cached)
    if taken:
        kv.cache_computed_blocks(r, len(ids))
        plain.register(r.id, ids)
    return taken


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), num_blocks=st.integers(3, 12), vocab=st.integers(1, 3))
def test_the_cache_takes_finds_and_evicts_as_the_plain_model(seed, num_blocks, vocab):
    rng = random.Random(seed)
    kv, plain = KVCacheManager(num_blocks, BS, prefix_caching=True), PlainCache(num_blocks)
    running: list[Request] = []
    for i in range(120):
        op = rng.random()
        if op < 0.3 or not running:  # a new request; few ids, so prefixes repeat
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 3 * BS))]
            r = Request(id=f"r{i}", index=i, prompt="x", prompt_ids=ids, max_new_tokens=99)
            if admit(kv, plain, r):
                running.append(r)
        elif op < 0.8:  # a decode
            r = rng.choice(running)
            # A running request here has every token computed: num_tokens of them.
            taken = kv.allocate_slots(r, 1, computed=r.num_tokens)
            assert taken == plain.allocate(r.id, r.num_tokens + 1, [])
            if taken:
                r.output_ids.append(rng.randrange(vocab))
                kv.cache_computed_blocks(r, r.num_tokens)
                plain.register(r.id, [*r.prompt_ids, *r.output_ids])
        else:  # a finish, or a preemption whose recompute is admitted again at once
            r = running.pop(rng.randrange(len(running)))
            kv.free(r)
            plain.free(r.id)
            if op < 0.9 and admit(kv, plain, r):
                running.append(r)
        assert list(kv.prefix.unheld) == plain.lru
        assert [kv.block_table(r) for r in running] == [plain.tables[r.id] for r in running]
        assert kv.num_free_blocks == len(plain.pool) + len(plain.lru)
