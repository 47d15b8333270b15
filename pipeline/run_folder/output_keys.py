"""Which config keys can change a run's generated tokens and which cannot: the one place
review and summary ask, so that `model.rope_theta` is never listed like `max_tokens`.

Tokens follow from the model, its weights' and cache's precision, the tokenizer, the
sampler and its seed, and the requests themselves. Scheduling, batching, padding and the
device's speed change when a token comes, never which one (the oracle tests hold padded,
chunked and bucketed steps to the dense reference), so those keys leave outputs alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class Effect(enum.StrEnum):
    changes = "changes outputs"
    numerics = "may change outputs (numerics)"  # another kernel or precision: last bits
    timing = "outputs unchanged (timing only)"


# by the key or the group it lies under (the first dotted part), most specific first
_BY_PREFIX: tuple[tuple[str, Effect], ...] = (
    ("model", Effect.changes),
    ("sampler", Effect.changes),
    ("tokenizer", Effect.changes),
    ("workload", Effect.changes),  # the requests themselves
    ("seed", Effect.changes),
    ("quantization", Effect.changes),
    ("kv_cache_dtype", Effect.changes),
    ("attention", Effect.numerics),  # the paged kernels against the dense reference
    ("executor", Effect.numerics),  # a simulated device's tokens are placeholders
    ("tp", Effect.numerics),  # the all-reduce's summation order
)


def effect(key: str) -> Effect:
    """What changing the dotted config key does to the generated tokens."""
    head = key.split(".", 1)[0].split("[", 1)[0]
    for prefix, found in _BY_PREFIX:
        if head == prefix:
            return found
    return Effect.timing


def echoes(key: str, config: Mapping[str, Any]) -> str | None:
    """The top-level key a nested one repeats (`scheduler.max_tokens` is `${max_tokens}`
    resolved), or None: a group's copy of a top-level key is said once, as that key."""
    last = key.rsplit(".", 1)[-1]
    if "." in key and last in config and not isinstance(config[last], Mapping):
        return last
    return None
