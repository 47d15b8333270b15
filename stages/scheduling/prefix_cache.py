"""The prefix cache's books: which block holds which content, how many requests hold each
block, and the cached blocks nobody holds in least-recently-used order (stages.scheduling.kv_cache
names the contents and hands the blocks out).

A block's name is read only by a later lookup, and a lookup or a clash can reach a block
only through the name of the first block of its sequence (its root: every later name
covers it). So while no other request has reached a root, the one request that registers
blocks under it keeps them unnamed (`UnnamedBlocks`): a workload whose prompts are each
their own (no hits) never names a block past its first. The first lookup or registration
by another request under that root names them all, as they would have been named one by
one (nothing else could have held or asked for those names meanwhile), and from then on
that root's blocks are named as they come.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from stages.scheduling.request import Request


class UnnamedBlocks:
    """The cached or held blocks one request registered under `root` without naming them,
    each with its place in the request's sequence (its name is the request's name there)."""

    __slots__ = ("request", "root", "place")

    def __init__(self, request: Request, root: bytes) -> None:
        self.request = request
        self.root = root
        self.place: dict[int, int] = {}  # block -> its place, in registration order


class PrefixCache:
    """Content names of full blocks, reference counts, and the cached blocks nobody holds
    in least-recently-used order."""

    def __init__(self, num_blocks: int) -> None:
        self.refs = [0] * num_blocks
        self.block_of: dict[bytes, int] = {}  # content name -> block
        # block -> its content name, or the unnamed blocks it is one of (None: no content)
        self.hash_of: list[bytes | UnnamedBlocks | None] = [None] * num_blocks
        self.unheld: OrderedDict[int, None] = OrderedDict()  # cached, held by nobody: LRU first
        self.unnamed: dict[bytes, UnnamedBlocks] = {}  # root -> its one request's blocks
        self.named_roots: set[bytes] = set()  # roots another request reached: named from then

    def hold(self, blocks: Iterable[int]) -> None:
        """One holder more for each block (a cached one nobody held leaves the LRU)."""
        refs, unheld = self.refs, self.unheld
        for block in blocks:
            refs[block] += 1
            unheld.pop(block, None)

    def drop(self, blocks: Iterable[int]) -> list[int]:
        """One holder fewer for each block; returns those now free (held by nobody, no
        content). One nobody holds whose content is known stays cached, most recent last."""
        refs, hash_of, unheld = self.refs, self.hash_of, self.unheld
        free = []
        for block in blocks:
            held = refs[block] - 1
            refs[block] = held
            if held:
                continue
            if hash_of[block] is not None:
                unheld[block] = None
            else:
                free.append(block)
        return free

    def register(self, blocks: Iterable[int], contents: Iterable[bytes]) -> None:
        """Each block's content is now its content, unless another block already holds it."""
        block_of, hash_of = self.block_of, self.hash_of
        for block, content in zip(blocks, contents, strict=True):
            if content not in block_of and hash_of[block] is None:
                block_of[content] = block
                hash_of[block] = content

    def register_unnamed(self, blocks: Sequence[int], first: int, unnamed: UnnamedBlocks) -> None:
        """`register` for the request's blocks from its `first` on, under its unnamed ones:
        no other block holds their contents (nobody else registered under their root)."""
        hash_of, place = self.hash_of, unnamed.place
        for at, block in enumerate(blocks, first):
            if hash_of[block] is None:
                hash_of[block] = unnamed
                place[block] = at

    def name(self, unnamed: UnnamedBlocks, names: Sequence[bytes]) -> None:
        """The unnamed blocks get their names (`names` by place), and their root's blocks
        are named from now on."""
        block_of, hash_of = self.block_of, self.hash_of
        for block, at in unnamed.place.items():
            block_of[names[at]] = block
            hash_of[block] = names[at]
        del self.unnamed[unnamed.root]
        self.named_roots.add(unnamed.root)

    def hold_fresh(self, blocks: Iterable[int]) -> None:
        """One holder for each block, blocks nobody held and whose content is unknown (just
        taken from the pool or evicted): `hold` without its look into the LRU."""
        refs = self.refs
        for block in blocks:
            refs[block] = 1

    def evict(self, count: int) -> list[int]:
        """The count least recently used cached blocks, their content forgotten, each now
        held by one (who takes them)."""
        oldest = self.unheld.popitem
        block_of, hash_of, refs = self.block_of, self.hash_of, self.refs
        blocks = []
        for _ in range(count):
            block = oldest(False)[0]  # (by position: keyword parsing costs more)
            content = hash_of[block]
            if isinstance(content, bytes):
                del block_of[content]
            elif content is not None:  # (a cached block's is never None)
                place = content.place
                del place[block]
                if not place:  # none of them left: the root is free again
                    del self.unnamed[content.root]
            hash_of[block] = None
            refs[block] = 1
            blocks.append(block)
        return blocks
