"""The KV-cache manager: the block pool, each request's block table, the scratch block and
the prefix cache.

The scheduler asks it for room (`allocate_slots`) and gives blocks back (`free`); the
metadata builder reads block tables from it, and the attention stage sizes its tensors by
it. Block arithmetic lives here and nowhere else.

Prefix caching: blocks are known by their identities (stages.scheduling.block_hashes makes them;
this manager only looks them up). A block is free (no content), held (by one or more requests:
its reference count), or cached (content kept, held by nobody): cached blocks are reused by
a later request with the same prefix, and evicted least recently used, only when a fresh
block is needed and none is free. A request's blocks are named only once another request
could find them (stages.scheduling.prefix_cache): a workload whose prompts are each their
own names one block a request.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from stages.arithmetic import IntOrArray, ceil_div
from stages.scheduling.block_hashes import BlockHasher
from stages.scheduling.prefix_cache import PrefixCache, UnnamedBlocks
from stages.scheduling.request import Request


def blocks_for(num_tokens: IntOrArray, block_size: int) -> IntOrArray:
    """Blocks that hold num_tokens tokens (each of an array's)."""
    return ceil_div(num_tokens, block_size)


class BlockPool:
    """Hands out the lowest-numbered free blocks first, so the blocks in use stay packed at
    the start of the pool: a decode step can then read the cache as one contiguous span
    instead of gathering block by block (see the metadata's decode span)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks))  # a heap; sorted is a valid heap

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")
        return [heapq.heappop(self._free) for _ in range(count)]

    def release(self, blocks: Sequence[int]) -> None:
        free = self._free
        for block in blocks:
            heapq.heappush(free, block)


class KVCacheManager:
    """Which blocks each request holds, keyed by the request's internal sequence number."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: the KV pool needs at least one block")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.prefix = PrefixCache(num_blocks) if prefix_caching else None
        self._tables: dict[int, list[int]] = {}
        self._registered: dict[int, int] = {}  # how many of its blocks have been registered
        self._unnamed: dict[int, UnnamedBlocks] = {}  # a request's, while it registers so
        self.hasher = BlockHasher(block_size)

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the scratch block not counted."""
        return self.pool.num_blocks

    @property
    def scratch_block(self) -> int:
        """One block past the pool: padding rows read and write it, never a request."""
        return self.pool.num_blocks

    @property
    def num_cache_blocks(self) -> int:
        """Blocks the attention stage's tensors hold: the pool and the scratch block."""
        return self.pool.num_blocks + 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request could be given now: free ones and cached ones nobody holds."""
        unheld = len(self.prefix.unheld) if self.prefix else 0
        return self.pool.num_free + unheld

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def block_table(self, request: Request) -> list[int]:
        """The request's blocks in sequence order (empty when it holds none)."""
        return self._tables.get(request.seq_id, [])

    def slots_held(self, requests: Sequence[Request]) -> list[int]:
        """Tokens the blocks each request holds have room for (a step's rows at once)."""
        tables, bs = self._tables, self.block_size
        return [len(tables.get(r.seq_id, ())) * bs for r in requests]

    # -- prefix caching ----------------------------------------------------------------------
    def match_prefix(self, request: Request) -> list[int]:
        """The cached blocks of the longest cached prefix of the request's tokens, whole
        blocks only, always leaving its last token to compute (so there are logits to
        sample); touches nothing. Empty without prefix caching, and for a request that asks
        for prompt log-probabilities (they need every prompt position's logits, as vLLM)."""
        if self.prefix is None or request.sampling.prompt_logprobs is not None:
            return []
        num_blocks = (request.num_tokens - 1) // self.block_size
        if num_blocks < 1 or not self._names_under_root(self.prefix, request):
            return []  # (a workload without hits: one name made and looked up)
        chain, block_of = self.hasher.hashes_to(request, num_blocks), self.prefix.block_of
        blocks = []
        for content in chain[:num_blocks]:
            block = block_of.get(content)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _names_under_root(self, prefix: PrefixCache, request: Request) -> bool:
        """Whether blocks under the request's root (its first block's name) may be known
        by name, those another request registered unnamed named first (stages.
        prefix_cache): where not, no block holds any of its prefixes."""
        root = self.hasher.hashes_to(request, 1)[0]
        unnamed = prefix.unnamed.get(root)
        if unnamed is not None:
            self._name(prefix, unnamed)
            return True
        return root in prefix.named_roots

    def _name(self, prefix: PrefixCache, unnamed: UnnamedBlocks) -> None:
        """Names the unnamed blocks, their request's names by place."""
        last = max(unnamed.place.values())
        prefix.name(unnamed, self.hasher.hashes_to(unnamed.request, last + 1))

    def _unnamed_of(self, prefix: PrefixCache, request: Request) -> UnnamedBlocks | None:
        """The unnamed blocks the request registers under, where no other request has
        reached its root; None where it registers by name."""
        unnamed = self._unnamed.get(request.seq_id)
        if unnamed is not None:
            if prefix.unnamed.get(unnamed.root) is unnamed:
                return unnamed
            del self._unnamed[request.seq_id]  # another request reached them: named
            return None
        root = self.hasher.hashes_to(request, 1)[0]
        if root in prefix.named_roots:
            return None
        other = prefix.unnamed.get(root)
        if other is not None:  # another request's: named first, as registering reads names
            self._name(prefix, other)
            return None
        unnamed = prefix.unnamed[root] = UnnamedBlocks(request, root)
        self._unnamed[request.seq_id] = unnamed
        return unnamed

    def content_of(self, block: int) -> bytes | None:
        """The block's content name (None: no content), its unnamed ones named first (a
        check's view: it changes no later step)."""
        prefix = self.prefix
        if prefix is None:
            return None
        content = prefix.hash_of[block]
        if not isinstance(content, UnnamedBlocks):
            return content
        self._name(prefix, content)
        named = prefix.hash_of[block]
        assert isinstance(named, bytes)
        return named

    def block_hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """Content hashes of the request's first num_blocks full blocks, each made once and
        kept on the request (a prompt's when admission first looks it up). A drawn prompt
        that names its prefixes (stages.trace) gives its blocks' identities by name, never
        drawing its ids; the blocks after it are hashed from it by content."""
        return self.hasher.hashes_to(request, num_blocks)[:num_blocks]

    def cache_computed_blocks(self, request: Request, computed: int) -> None:
        """Registers the content of the request's blocks that its first `computed` tokens
        fill (their keys and values are written)."""
        if self.prefix is None:
            return
        seq_id = request.seq_id
        full = computed // self.block_size
        done = self._registered.get(seq_id, 0)
        if full > done:  # the common case, a decode within a block, returns here
            table = self._tables.get(seq_id, [])
            full = full if full < len(table) else len(table)
            unnamed = self._unnamed_of(self.prefix, request)
            if unnamed is None:
                chain = self.hasher.hashes_to(request, full)
                self.prefix.register(table[done:full], chain[done:full])
            else:
                self.prefix.register_unnamed(table[done:full], done, unnamed)
            self._registered[seq_id] = full

    def cache_computed_blocks_of(self, requests: Sequence[tuple[Request, int]]) -> None:
        """cache_computed_blocks for each request with its computed tokens, skipping those
        whose tokens fill no block beyond the registered ones (a decode within a block)."""
        if self.prefix is None:
            return
        registered, bs = self._registered, self.block_size
        for request, computed in requests:
            if computed // bs > registered.get(request.seq_id, 0):
                self.cache_computed_blocks(request, computed)

    # -- allocation --------------------------------------------------------------------------
    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached: Sequence[int] = (), *, computed: int
    ) -> bool:
        """Room for num_new_tokens more tokens of the request after its `computed` ones;
        False (nothing taken) when the pool cannot give it. `cached` is a prefix
        match_prefix found for a request holding no blocks, whose `computed` already counts
        them: it takes them too."""
        table = self._tables.get(request.seq_id)
        held = len(table) if table else 0
        new = ceil_div(computed + num_new_tokens, self.block_size) - held - len(cached)
        if new <= 0 and not cached:  # the common case: a decode within its last block
            return True
        unheld = sum(map(self.prefix.unheld.__contains__, cached)) if cached else 0
        new = new if new > 0 else 0
        if new > self.num_free_blocks - unheld:
            return False
        table = self._tables.setdefault(request.seq_id, [])
        if cached:
            self.prefix.hold(cached)
            # A cached block's content is registered already (that is how it was found).
            self._registered[request.seq_id] = len(cached)
        table.extend(cached)
        table.extend(self._take(new))
        return True

    def take_blocks(self, requests: Sequence[Request]) -> None:
        """One fresh block more for each of `requests`, in their order (one may come again):
        what their decodes' allocate_slots take one after another, evicting alike."""
        tables = self._tables
        for request, block in zip(requests, self._take(len(requests)), strict=True):
            tables[request.seq_id].append(block)

    def _take(self, count: int) -> list[int]:
        """count fresh blocks, each now held by one: free ones first, then cached ones nobody
        holds, oldest first. Raises where there are fewer."""
        pool, prefix = self.pool, self.prefix
        free = pool.num_free
        if count <= free:
            blocks = pool.allocate(count)
            if prefix is not None:
                prefix.hold_fresh(blocks)
            return blocks
        # Once the cache fills, the pool is empty: evictions.
        if prefix is None or count > free + len(prefix.unheld):
            raise RuntimeError(f"asked for {count} blocks, {self.num_free_blocks} free")
        if not free:
            return prefix.evict(count)
        blocks = pool.allocate(free)
        prefix.hold_fresh(blocks)
        return blocks + prefix.evict(count - free)

    def free(self, request: Request) -> None:
        """The request lets go of every block it holds: a block nobody holds goes back to
        the pool, or stays cached when its content is known."""
        table = self._tables.pop(request.seq_id, [])
        self._registered.pop(request.seq_id, None)
        self._unnamed.pop(request.seq_id, None)
        free = table if self.prefix is None else self.prefix.drop(table)
        if free:
            self.pool.release(free)
