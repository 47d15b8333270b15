"""How a disaggregated deployment's router picks each request's instance in a pool
(`disagg.router`), as the routers its deploy files name do it:

- `round_robin`: the next instance in turn, in the order the requests reach the pool
  (vLLM's example proxy, vllm-router's `--policy round_robin`);
- `consistent_hash`: a hash ring of 160 virtual nodes an instance, the request's key
  hashed onto it and the first node clockwise taking it (vllm-router's `--policy
  consistent_hash`, github.com/vllm-project/router src/policies/consistent_hash.rs: with no
  session header or user field, the key is the request's body, so each prompt has its
  instance and the same prompt always the same one). Each pool has its own ring (its
  instances' addresses differ), so a request's prefill and decode instances are picked
  apart.

Under a closed loop, the policy decides whether requests sent together stay together: in
turn, the requests a burst sends split evenly and finish together, again and again; hashed,
they split unevenly and drift apart.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from stages.scheduling.request import PromptIds, Request

POLICIES = ("round_robin", "consistent_hash")
VIRTUAL_NODES = 160  # a worker's virtual nodes on vllm-router's ring (consistent_hash.rs)


class Router(Protocol):
    def pick(self, request: Request) -> int:
        """The index of the instance that serves `request`."""
        ...


class RoundRobin:
    def __init__(self, instances: int) -> None:
        self._turns = itertools.cycle(range(instances))

    def pick(self, request: Request) -> int:
        return next(self._turns)


def prompt_key(request: Request) -> bytes:
    """The prompt's ids as bytes, equal only for equal prompts; a drawn prompt's name for
    them where it has one (its ids are not made for it)."""
    ids = request.prompt_ids
    if isinstance(ids, PromptIds):
        named = ids.prefix_keys([len(ids)])
        return named[0] if named else ids.array().astype(np.int64).tobytes()
    return np.asarray(ids, dtype=np.int64).tobytes()


def ring_hash(key: bytes) -> int:
    """A stable 64-bit hash (Python's own `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class ConsistentHash:
    """A ring of `instances` x VIRTUAL_NODES points; a request goes to the instance of the
    first point at or after its prompt's hash (wrapping around). `pool` names the ring's
    instances, as their addresses do."""

    def __init__(self, instances: int, pool: str) -> None:
        points = sorted(
            (ring_hash(f"{pool}-{i}:{v}".encode()), i)
            for i in range(instances)
            for v in range(VIRTUAL_NODES)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [i for _, i in points]

    def pick(self, request: Request) -> int:
        at = bisect.bisect_left(self._hashes, ring_hash(prompt_key(request)))
        return self._owners[at % len(self._owners)]


def policy_error(policy: str) -> str | None:
    """The one-line error for a policy no router here has (None: one it has)."""
    if policy in POLICIES:
        return None
    return f"disagg.router={policy!r}: give one of {', '.join(POLICIES)}"


def make_router(policy: str, instances: int, pool: str) -> Router:
    """The policy's router over a pool of `instances` (ValueError for any other name)."""
    if policy == "round_robin":
        return RoundRobin(instances)
    if policy == "consistent_hash":
        return ConsistentHash(instances, pool)
    raise ValueError(policy_error(policy))


def shares(router: Router, requests: Sequence[Request], instances: int) -> list[list[Request]]:
    """Each instance's requests, in the order given, as the router picks them."""
    picked: list[list[Request]] = [[] for _ in range(instances)]
    for request in requests:
        picked[router.pick(request)].append(request)
    return picked
