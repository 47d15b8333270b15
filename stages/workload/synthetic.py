"""Generated workloads: seeded prompts with lengths drawn from ranges, alone or as named
parts served together."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from stages.interfaces import Tokenizer
from stages.scheduling.request import Request
from stages.workload.arrivals import closed_loop, poisson_arrivals
from stages.workload.prompt_text import seeded_text


class SyntheticWorkload:
    """Seeded prompts with lengths drawn uniformly from a token range, each asking for a
    number of new tokens drawn from another, like vLLM's random dataset but readable
    (words, not random ids); Poisson arrivals at `rate` from `start_s`. With
    `shared_prefix_tokens`, each prompt starts with one of `num_prefixes` shared prefixes of
    that length (a system prompt), request i with prefix i mod num_prefixes."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(
        self,
        num_requests: int,
        min_prompt_tokens: int,
        max_prompt_tokens: int,
        min_new_tokens: int,
        max_new_tokens: int,
        ignore_eos: bool,
        rate: float,
        start_s: float,
        seed: int,
        shared_prefix_tokens: int,
        num_prefixes: int,
        concurrency: int,
    ) -> None:
        self.concurrency = closed_loop(concurrency)
        if shared_prefix_tokens < 0 or num_prefixes < 1:
            raise ValueError(
                "workload.shared_prefix_tokens must be >= 0 (0 = none) and "
                "workload.num_prefixes >= 1"
            )
        if not 1 <= min_prompt_tokens <= max_prompt_tokens:
            raise ValueError(
                "workload.min_prompt_tokens must be >= 1 and <= workload.max_prompt_tokens"
            )
        if not 1 <= min_new_tokens <= max_new_tokens:
            raise ValueError("workload.min_new_tokens must be >= 1 and <= workload.max_new_tokens")
        if num_requests < 1 or rate < 0 or start_s < 0:
            raise ValueError(
                "workload.num_requests must be >= 1, workload.rate >= 0 and workload.start_s >= 0"
            )
        self.num_requests = num_requests
        self.prompt_range = (min_prompt_tokens, max_prompt_tokens)
        self.new_range = (min_new_tokens, max_new_tokens)
        self.ignore_eos = ignore_eos
        self.rate = rate
        self.start_s = start_s
        self.seed = seed
        self.shared_prefix_tokens = shared_prefix_tokens
        self.num_prefixes = num_prefixes

    def _prefixes(self, tokenizer: Tokenizer) -> list[str]:
        """The shared prefixes, from a stream of their own: without them, a seed gives the
        same prompts as it always has."""
        if not self.shared_prefix_tokens:
            return [""]
        rng = np.random.default_rng([self.seed, 1])
        length = self.shared_prefix_tokens
        return [seeded_text(rng, tokenizer, length) + " " for _ in range(self.num_prefixes)]

    def load(self, tokenizer: Tokenizer, id_prefix: str = "req") -> list[Request]:
        rng = np.random.default_rng(self.seed)
        lengths = rng.integers(self.prompt_range[0], self.prompt_range[1] + 1, self.num_requests)
        new_tokens = rng.integers(self.new_range[0], self.new_range[1] + 1, self.num_requests)
        arrivals = poisson_arrivals(self.num_requests, self.rate, rng, self.start_s)
        prefixes = self._prefixes(tokenizer)
        requests = []
        for i in range(self.num_requests):
            prompt = prefixes[i % len(prefixes)] + seeded_text(rng, tokenizer, int(lengths[i]))
            requests.append(
                Request(
                    id=f"{id_prefix}-{i}",
                    index=i,
                    prompt=prompt,
                    prompt_ids=tokenizer.encode(prompt),
                    max_new_tokens=int(new_tokens[i]),
                    arrival_s=arrivals[i],
                    ignore_eos=self.ignore_eos,
                )
            )
        return requests


class MixedWorkload:
    """Several synthetic workloads served together, each a named part with its own lengths,
    arrivals and seed; ids are `PART-i`, in the order the parts are given.

    The case chunked prefill exists for is two parts: many short prompts that decode for
    long, all at once, and long prompts that arrive while they decode."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(self, parts: Mapping[str, SyntheticWorkload], concurrency: int) -> None:
        if not parts:
            raise ValueError("workload.parts needs at least one part")
        for name, part in parts.items():
            if part.concurrency:
                raise ValueError(
                    f"workload.parts.{name}.concurrency: the parts share one limit; "
                    "give workload.concurrency instead"
                )
        self.parts = dict(parts)
        self.concurrency = closed_loop(concurrency)

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        requests: list[Request] = []
        for name, part in self.parts.items():
            for request in part.load(tokenizer, id_prefix=name):
                request.index = len(requests)
                requests.append(request)
        return requests
