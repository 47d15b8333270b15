"""How a disaggregated deployment's router picks each request's instance in a pool
(`disagg.router`), as the routers its deploy files name do it:

- `round_robin`: the next instance in turn, in the order the requests reach the pool
  (vLLM's example proxy, vllm-router's `--policy round_robin`);
- `random`: any instance alike (vllm-router's and SGLang's router's `--policy random`);
- `power_of_two`: of two instances drawn at random, the one with fewer requests in flight
  from the router (sent there and not yet answered: a prefill instance's until its first
  token, a decode instance's until its last), the first of the two on a tie (their
  `--policy power_of_two`);
- `cache_aware`: vllm-router's and SGLang's router's default. The router keeps each
  instance's prompts in a prefix tree; while the busiest instance holds more than 64
  requests in flight beyond the idlest and more than 1.5 times as many, the idlest takes
  the request; else the instance whose tree shares the longest prefix with it, where that
  prefix is over 0.3 of the prompt; else the instance with the smallest tree; the prompt
  then joins its instance's tree (the command-line defaults, vllm-project/router
  docs/benchmarks/router_overhead.md). Here the tree holds prompts in whole pieces of 16
  tokens, not characters, and is never evicted (the routers prune it on a timer);
- `consistent_hash`: a hash ring of 160 virtual nodes an instance, the request's key
  hashed onto it and the first node clockwise taking it (vllm-router's `--policy
  consistent_hash`, github.com/vllm-project/router src/policies/consistent_hash.rs: with no
  session header or user field, the key is the request's body, so each prompt has its
  instance and the same prompt always the same one). Each pool has its own ring (its
  instances' addresses differ), so a request's prefill and decode instances are picked
  apart.

Under a closed loop, the policy decides whether requests sent together stay together: in
turn, the requests a burst sends split evenly and finish together, again and again; hashed
or drawn, they split unevenly and drift apart. A policy that follows the load needs the
instances side by side in time order, so a deployment behind one is served as a closed
loop is (pipeline.disagg.closed_loop), without a concurrency limit in an open loop.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from stages.scheduling.request import PromptIds, Request

POLICIES = ("round_robin", "consistent_hash", "random", "power_of_two", "cache_aware")
CACHE_THRESHOLD, BALANCE_ABS, BALANCE_REL = 0.3, 64, 1.5  # vllm-router's command line
PIECE_TOKENS = 16  # cache_aware's tree holds prompts in pieces this long
VIRTUAL_NODES = 160  # a worker's virtual nodes on vllm-router's ring (consistent_hash.rs)


class Router(Protocol):
    # True: its picks depend on the requests in flight, so each instance's answers must
    # reach it in time order (`finished`)
    follows_load: bool

    def pick(self, request: Request) -> int:
        """The index of the instance that serves `request`."""
        ...

    def finished(self, instance: int) -> None:
        """A request the router sent to `instance` was answered."""
        ...


class RoundRobin:
    follows_load = False

    def __init__(self, instances: int) -> None:
        self._turns = itertools.cycle(range(instances))

    def pick(self, request: Request) -> int:
        return next(self._turns)

    def finished(self, instance: int) -> None:
        pass


class Drawn:
    """`random`, and `power_of_two` (`two`: the lighter of two distinct draws), each pool
    drawing from its own seeded generator."""

    def __init__(self, instances: int, pool: str, two: bool) -> None:
        self._rng, self._two = random.Random(f"router-{pool}"), two and instances > 1
        self._in_flight = [0] * instances
        self.follows_load = self._two

    def pick(self, request: Request) -> int:
        if self._two:
            a, b = self._rng.sample(range(len(self._in_flight)), 2)
            i = b if self._in_flight[b] < self._in_flight[a] else a
        else:
            i = self._rng.randrange(len(self._in_flight))
        self._in_flight[i] += 1
        return i

    def finished(self, instance: int) -> None:
        self._in_flight[instance] -= 1


def prompt_key(request: Request) -> bytes:
    """The prompt's ids as bytes, equal only for equal prompts; a drawn prompt's name for
    them where it has one (its ids are not made for it)."""
    ids = request.prompt_ids
    named = ids.prefix_keys([len(ids)]) if isinstance(ids, PromptIds) else None
    return named[0] if named else prompt_array(request).tobytes()


def prompt_array(request: Request) -> np.ndarray:
    """The prompt's ids as one int64 array (a drawn prompt's made for it)."""
    ids = request.prompt_ids
    return (ids.array() if isinstance(ids, PromptIds) else np.asarray(ids)).astype(np.int64)


class CacheAware:
    follows_load = True

    def __init__(self, instances: int) -> None:
        self._trees: list[set[bytes]] = [set() for _ in range(instances)]
        self._in_flight = [0] * instances

    def pick(self, request: Request) -> int:
        pieces = prefix_pieces(request)
        load = self._in_flight
        if max(load) - min(load) > BALANCE_ABS and max(load) > BALANCE_REL * min(load):
            i = load.index(min(load))
        else:
            shared = [self._shared(tree, pieces) for tree in self._trees]
            best = max(range(len(shared)), key=shared.__getitem__)
            tokens = max(1, len(request.prompt_ids))
            if shared[best] * PIECE_TOKENS / tokens > CACHE_THRESHOLD:
                i = best
            else:
                sizes = [len(tree) for tree in self._trees]
                i = sizes.index(min(sizes))
        self._trees[i].update(pieces)
        load[i] += 1
        return i

    def finished(self, instance: int) -> None:
        self._in_flight[instance] -= 1

    @staticmethod
    def _shared(tree: set[bytes], pieces: list[bytes]) -> int:
        n = 0
        while n < len(pieces) and pieces[n] in tree:
            n += 1
        return n


def prefix_pieces(request: Request) -> list[bytes]:
    """A name for each whole piece of PIECE_TOKENS of the prompt, with all before it: equal
    for two prompts only as far as they agree."""
    array = prompt_array(request)
    names, name = [], b""
    for start in range(0, len(array) - PIECE_TOKENS + 1, PIECE_TOKENS):
        name = hashlib.blake2b(name + array[start : start + PIECE_TOKENS].tobytes(),
                               digest_size=16).digest()  # fmt: skip
        names.append(name)
    return names


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

    follows_load = False

    def pick(self, request: Request) -> int:
        at = bisect.bisect_left(self._hashes, ring_hash(prompt_key(request)))
        return self._owners[at % len(self._owners)]

    def finished(self, instance: int) -> None:
        pass


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
    if policy in ("random", "power_of_two"):
        return Drawn(instances, pool, two=policy == "power_of_two")
    if policy == "cache_aware":
        return CacheAware(instances)
    raise ValueError(policy_error(policy))


def shares(router: Router, requests: Sequence[Request], instances: int) -> list[list[Request]]:
    """Each instance's requests, in the order given, as the router picks them."""
    picked: list[list[Request]] = [[] for _ in range(instances)]
    for request in requests:
        picked[router.pick(request)].append(request)
    return picked
