"""Seeded, readable prompt text of a given length in tokens, for the generated workloads."""

from __future__ import annotations

import numpy as np

from stages.interfaces import Tokenizer

WORDS = (
    "the block cache token prefill decode chunk budget batch shape bucket warmup step "
    "request model layer head key value query rotary norm expert graph device kernel "
    "stream queue latency throughput gaudi paddle hydra sweep review deploy serve"
).split()


def prompt_of_length(tokenizer: Tokenizer, text: str, target: int) -> str:
    """The longest prefix of `text` (one character at least) that encodes to at most
    `target` tokens: exactly `target` for the byte tokenizer, within a token or two for a
    subword one. A binary search, as the token count grows with the prefix."""
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(text[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def seeded_text(rng: np.random.Generator, tokenizer: Tokenizer, target: int) -> str:
    """Seeded words encoding to `target` tokens (within a token or two for subwords)."""
    words = rng.choice(WORDS, size=target + 8).tolist()
    text = " ".join(words)
    while len(tokenizer.encode(text)) < target:  # a subword tokenizer merges words
        text += " " + " ".join(rng.choice(WORDS, size=target).tolist())
    return prompt_of_length(tokenizer, text, target)
