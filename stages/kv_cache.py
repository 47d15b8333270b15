"""The KV-cache manager: the block pool, each request's block table and the scratch block.

The scheduler asks it for room (`allocate_slots`) and gives blocks back (`free`); the
metadata builder reads block tables from it, and the attention stage sizes its tensors by
it. Block arithmetic lives here and nowhere else.
"""

from __future__ import annotations

import heapq

from stages.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold num_tokens tokens."""
    return -(-num_tokens // block_size)


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

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            heapq.heappush(self._free, block)


class KVCacheManager:
    """Which blocks each request holds, keyed by the request's internal sequence number."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: the KV pool needs at least one block")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._tables: dict[int, list[int]] = {}

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
        return self.pool.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def block_table(self, request: Request) -> list[int]:
        """The request's blocks in sequence order (empty when it holds none)."""
        return self._tables.get(request.seq_id, [])

    def num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks the request still needs to hold its computed tokens plus num_new_tokens."""
        total = self.blocks_for(request.num_computed + num_new_tokens)
        return max(0, total - len(self.block_table(request)))

    def can_fit(self, request: Request, num_new_tokens: int) -> bool:
        return self.num_new_blocks(request, num_new_tokens) <= self.pool.num_free

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Room for num_new_tokens more tokens of the request; False (nothing taken) when
        the pool cannot give it."""
        needed = self.num_new_blocks(request, num_new_tokens)
        if needed > self.pool.num_free:
            return False
        if needed:
            self._tables.setdefault(request.seq_id, []).extend(self.pool.allocate(needed))
        return True

    def free(self, request: Request) -> None:
        """Every block the request holds goes back to the pool."""
        self.pool.release(self._tables.pop(request.seq_id, []))
