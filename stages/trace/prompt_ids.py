"""Lazy prompt ids: a token-count row's prompt is known by length until used, then drawn
from `seed` (`SeededPromptIds`), so a million-row trace costs its Request objects, never its
prompt tokens."""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from stages.arithmetic import ceil_div
from stages.interfaces import Tokenizer
from stages.scheduling.request import PromptIds


class PromptIdSource:
    """Draws prompt ids for SeededPromptIds, and keeps those of the most recently used
    `capacity` prompts, which covers every running request: the others are dropped and drawn
    again, identically, if used again."""

    def __init__(self, vocab: np.ndarray, seed: int, block_size: int, capacity: int) -> None:
        self.vocab = vocab  # the ids a prompt may hold: the vocabulary without special ids
        self.seed = seed
        self.block_size = block_size
        self.capacity = capacity
        self._cache: OrderedDict[int, SeededPromptIds] = OrderedDict()
        # What a row's stream depends on besides its line: equal tags, equal streams.
        self.tag = hashlib.blake2b(
            np.int64(seed).tobytes() + np.asarray(vocab, np.int64).tobytes(), digest_size=8
        ).digest()

    def ids(self, prompt: SeededPromptIds) -> list[int]:
        array = self.array(prompt)
        if prompt._ids is None:
            prompt._ids = array.tolist()
        return prompt._ids

    def array(self, prompt: SeededPromptIds) -> np.ndarray:
        """The prompt's ids as drawn (an array; `ids` makes the list only when asked)."""
        if prompt._array is not None:
            self._cache.move_to_end(id(prompt))
            return prompt._array
        prompt._array = self.draw(prompt._key, len(prompt))
        self._cache[id(prompt)] = prompt
        while len(self._cache) > self.capacity:
            _, evicted = self._cache.popitem(last=False)
            evicted._ids = evicted._array = None
        return prompt._array

    def _stream(self, domain: int, number: int, count: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, domain, number))
        return self.vocab[rng.integers(0, len(self.vocab), count)]

    def draw(self, key: int | tuple[int, tuple[int, ...]], length: int) -> np.ndarray:
        """A row's ids from its own stream; with hash ids, block j's ids come from hash id j's
        stream, so the same id gives the same block in every row that holds it."""
        if isinstance(key, int):
            return self._stream(0, key, length)
        line, hash_ids = key
        blocks = [
            self._stream(1, h, self.block_size)
            for h in hash_ids[: ceil_div(length, self.block_size)]
        ]
        covered = len(blocks) * self.block_size
        if covered < length:  # more tokens than hash ids: the rest is the row's own
            blocks.append(self._stream(0, line, length - covered))
        return np.concatenate(blocks)[:length]


class SeededPromptIds(PromptIds):
    """A prompt's token ids, known by length until used: `len()` is O(1); indexing, slicing,
    iteration and `+` draw them (once, while in use) from the shared PromptIdSource."""

    __slots__ = ("_length", "_key", "_source", "_ids", "_array")

    def __init__(
        self, length: int, key: int | tuple[int, tuple[int, ...]], source: PromptIdSource
    ) -> None:
        self._length = length
        self._key = key  # a row's line, or (line, hash ids) for a Mooncake row
        self._source = source
        self._ids: list[int] | None = None
        self._array: np.ndarray | None = None  # the ids as drawn, the list made from it

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):  # an int or a slice, as a list
        return self._source.ids(self)[index]

    def array(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The ids start..end-1 as an array, without making the list (block hashing reads
        a prompt so)."""
        return self._source.array(self)[start:end]

    def __iter__(self) -> Iterator[int]:
        return iter(self._source.ids(self))

    def __add__(self, other: Sequence[int]) -> list[int]:
        return self._source.ids(self) + list(other)

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return list(other) + self._source.ids(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SeededPromptIds | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # equal to lists, so unhashable like them

    def prefix(self, length: int) -> SeededPromptIds:
        """The first `length` ids, still undrawn: a row's stream and a block's are drawn in
        order, so a shorter draw is a prefix of a longer one."""
        return SeededPromptIds(min(length, self._length), self._key, self._source)

    def prefix_keys(self, ends: Sequence[int]) -> list[bytes] | None:
        """Names for the ids 0..end-1 of each end, made without drawing them: a row's own
        stream is fixed by its source's seed and vocabulary and its line, and a shorter draw
        is a longer one's start, so equal names mean equal ids. None for a Mooncake row,
        whose blocks are shared through hash ids and so are known by their content."""
        line = self._key
        if not isinstance(line, int):
            return None
        if ends:
            # A range (what admission asks for) or one end (a decode's block) gives its
            # ends without a pass over it.
            rising = len(ends) == 1 or type(ends) is range and ends.step > 0
            low, high = (ends[0], ends[-1]) if rising else (min(ends), max(ends))
            if not 0 < low <= high <= self._length:
                raise ValueError(f"prefix_keys from {low} to {high} of {self._length} ids")
        pack, tag = PREFIX_KEY.pack, self._source.tag
        return [pack(tag, line, end) for end in ends]  # (map's set-up costs more for a few)

    def __repr__(self) -> str:
        return f"SeededPromptIds(length={self._length}, key={self._key!r})"


# A drawn prompt's prefix name: its source's tag, the row's line and the prefix's length.
# 24 bytes, so never equal to a content hash (stages.scheduling.kv_cache.chain_hash's are 16).
PREFIX_KEY = struct.Struct("<8sqq")


def prompt_vocab(tokenizer: Tokenizer) -> np.ndarray:
    """The ids a drawn prompt may hold: the tokenizer's vocabulary without its special ids."""
    special = {tokenizer.bos_id, tokenizer.pad_id} | tokenizer.eos_ids | tokenizer.special_ids
    vocab = np.setdiff1d(
        np.arange(tokenizer.vocab_size, dtype=np.int64),
        np.array([i for i in special if i is not None], dtype=np.int64),
    )
    if len(vocab) == 0:
        raise ValueError("the tokenizer has no ids besides its special ones to draw prompts from")
    return vocab
