"""The KV-cache block pool: which blocks are free. Requests hold their own block tables."""

from __future__ import annotations

import heapq


def blocks_for(num_tokens: int, block_size: int) -> int:
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
