"""Chat conversations replayed turn by turn, each turn's prompt the one before plus its
answer and a new question."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from stages.interfaces import Tokenizer
from stages.scheduling.request import Request
from stages.workload.arrivals import closed_loop, poisson_arrivals
from stages.workload.prompt_text import seeded_text


class MultiTurnWorkload:
    """Chat conversations replayed turn by turn, as from a recorded chat log: turn t's
    prompt is the conversation's system prompt, every earlier question with its recorded
    answer, and a new question, so each turn's prompt is the previous one plus its answer
    plus a question, and a prefix cache serves all but the new tail. A turn asks for as
    many new tokens as its recorded answer has (ignoring EOS) and arrives `turn_gap_s`
    after the previous one; conversations start as a Poisson process at `rate` (0: all
    at once). Ids are `convC-turnT`."""

    counts: Mapping[str, Any] = MappingProxyType({})  # nothing is dropped or clipped

    def __init__(
        self,
        num_conversations: int,
        turns: int,
        system_prompt_tokens: int,
        min_question_tokens: int,
        max_question_tokens: int,
        min_answer_tokens: int,
        max_answer_tokens: int,
        rate: float,
        turn_gap_s: float,
        seed: int,
        concurrency: int,
    ) -> None:
        self.concurrency = closed_loop(concurrency)
        if num_conversations < 1 or turns < 1 or system_prompt_tokens < 0:
            raise ValueError(
                "workload.num_conversations and workload.turns must be >= 1, "
                "workload.system_prompt_tokens >= 0"
            )
        if not 1 <= min_question_tokens <= max_question_tokens:
            raise ValueError("workload.min_question_tokens must be >= 1 and <= the max")
        if not 1 <= min_answer_tokens <= max_answer_tokens:
            raise ValueError("workload.min_answer_tokens must be >= 1 and <= the max")
        if rate < 0 or turn_gap_s < 0:
            raise ValueError("workload.rate and workload.turn_gap_s must be >= 0")
        self.num_conversations = num_conversations
        self.turns = turns
        self.system_prompt_tokens = system_prompt_tokens
        self.question_range = (min_question_tokens, max_question_tokens)
        self.answer_range = (min_answer_tokens, max_answer_tokens)
        self.rate = rate
        self.turn_gap_s = turn_gap_s
        self.seed = seed

    def _conversation(
        self, rng: np.random.Generator, tokenizer: Tokenizer, c: int, start: float
    ) -> list[Request]:
        history = (
            seeded_text(rng, tokenizer, self.system_prompt_tokens) + "\n"
            if self.system_prompt_tokens
            else ""
        )
        turns = []
        for t in range(self.turns):
            question_tokens = int(rng.integers(*self.question_range, endpoint=True))
            question = seeded_text(rng, tokenizer, question_tokens)
            answer_tokens = int(rng.integers(*self.answer_range, endpoint=True))
            prompt = f"{history}user: {question}\nassistant:"
            turns.append(
                Request(
                    id=f"conv{c}-turn{t}",
                    index=0,
                    prompt=prompt,
                    prompt_ids=tokenizer.encode(prompt),
                    max_new_tokens=answer_tokens,
                    arrival_s=start + t * self.turn_gap_s,
                    ignore_eos=True,
                )
            )
            history = f"{prompt} {seeded_text(rng, tokenizer, answer_tokens)}\n"
        return turns

    def load(self, tokenizer: Tokenizer) -> list[Request]:
        rng = np.random.default_rng(self.seed)
        starts = poisson_arrivals(self.num_conversations, self.rate, rng)
        requests: list[Request] = []
        for c, start in enumerate(starts):
            for request in self._conversation(rng, tokenizer, c, start):
                request.index = len(requests)
                requests.append(request)
        return requests
