"""How long a step's next prefill chunk may be, and what it costs the step's token budget.

`budget`: `padded` (the HPU rule, default) charges the tokens the device computes, since
the step's prefill rows are padded to one rectangle of whole blocks: adding a row grows it
from rows x width to (rows + 1) x max(width, the row's blocks). The budget then bounds the
padded step, so the metadata builder never meets a step larger than the budget and never
has to drop or split a scheduled row (FastDeploy's metadata op capped padded slots while
its scheduler counted real tokens, and dropped what did not fit). `real` charges real
tokens only (vLLM's rule); the padded step may then exceed the budget.

A whole-prompt policy (scheduler=whole, static) takes a prompt in one chunk or not at all.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from stages.scheduling.kv_cache import blocks_for


class Budget(enum.StrEnum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    padded = "padded"  # a prefill row costs its share of the padded rectangle
    real = "real"  # a prefill row costs its real tokens


@dataclass(slots=True)
class Rectangle:
    """A step's prefill rows padded to one width of whole blocks, as the HPU runs them."""

    block_size: int
    rows: int = 0
    width: int = 0
    rounded: int = 0  # the rows' own lengths rounded up to blocks: padding no layout avoids

    @property
    def area(self) -> int:
        return self.rows * self.width

    def _rounded(self, n: int) -> int:
        return blocks_for(n, self.block_size) * self.block_size

    def padding_with(self, n: int) -> float:
        """Share of the rectangle that would pad rows out to a longer neighbour's width."""
        width = max(self.width, self._rounded(n))
        return 1.0 - (self.rounded + self._rounded(n)) / ((self.rows + 1) * width)

    def add(self, n: int) -> int:
        """Adds a row of n tokens; returns how much the area grew."""
        before, rounded = self.rows * self.width, self._rounded(n)
        self.rows += 1
        self.width = max(self.width, rounded)
        self.rounded += rounded
        return self.rows * self.width - before


@dataclass(slots=True)
class StepBudget:
    """The tokens a step has left, and the prefill rectangle it has built so far."""

    left: int
    rect: Rectangle


@dataclass(frozen=True)
class ChunkPolicy:
    """The scheduler's chunk rule: its knobs are the scheduler's config keys."""

    block_size: int
    max_tokens: int
    padded: bool  # scheduler.budget=padded
    max_padding: float
    align_chunks: bool
    long_prefill_threshold: int
    max_prefill_rows: int
    whole: bool = False  # a prompt is prefilled in one step or waits

    def __post_init__(self) -> None:
        if self.padded and self.max_tokens < self.block_size:
            raise ValueError(
                f"max_tokens={self.max_tokens} < block_size={self.block_size}: with "
                "scheduler.budget=padded a prefill row costs whole blocks; raise max_tokens "
                "or lower block_size"
            )
        if not 0.0 <= self.max_padding <= 1.0:
            raise ValueError(f"scheduler.max_padding={self.max_padding}: choose a value in [0, 1]")
        if self.max_prefill_rows < 0:
            raise ValueError(
                f"scheduler.max_prefill_rows={self.max_prefill_rows}: 0 (no cap) or more"
            )

    def step_budget(self, left: int | None = None) -> StepBudget:
        """A fresh step's budget: all of max_tokens, or `left` of it."""
        return StepBudget(self.max_tokens if left is None else left, Rectangle(self.block_size))

    def one_step_error(self, num_tokens: int) -> str | None:
        """What keeps a prefill of num_tokens from ever being scheduled: nothing when
        prompts are split; a whole prompt must fit one step's budget."""
        if not self.whole:
            return None
        cost = blocks_for(num_tokens, self.block_size) * self.block_size
        cost = cost if self.padded else num_tokens
        if cost <= self.max_tokens:
            return None
        return (
            f"{num_tokens} tokens ({cost} padded to whole blocks), more than "
            f"max_tokens={self.max_tokens}, and scheduler=whole never splits a prompt"
        )

    def length(self, remaining: int, budget: StepBudget) -> int:
        """Tokens of a prefill to run now; 0 means it waits for a later step.

        With the padded budget a chunk may only be as long as the rectangle it grows
        still fits, and it may not leave more than `max_padding` of the rectangle padding."""
        rect = budget.rect
        if self.max_prefill_rows and rect.rows >= self.max_prefill_rows:
            return 0  # as FastDeploy's MAX_PREFILL_NUM: no more prompts in this step
        n = min(remaining, budget.left)
        if self.padded:
            # A row within the current width costs that width; a wider one regrows the
            # rectangle, at most to the widest that rows + 1 rows still fit.
            widest = (budget.left + rect.area) // (rect.rows + 1)
            widest -= widest % self.block_size
            n = min(
                remaining,
                max(
                    rect.width if rect.width <= budget.left else 0,
                    widest if widest >= rect.width else 0,
                ),
            )
        if self.long_prefill_threshold:
            n = min(n, self.long_prefill_threshold)
        if n < remaining and self.align_chunks:
            # The HPU writes the cache in whole blocks, so a chunk that does not finish the
            # prompt must end on a block boundary; a leftover below a block waits.
            n -= n % self.block_size
        if n and rect.rows and rect.padding_with(n) > self.max_padding:
            return 0  # a short row beside a wide one: it leads a later step instead
        if self.whole and n != remaining:
            return 0
        return n

    def charge(self, n: int, budget: StepBudget) -> None:
        """Takes a prefill chunk of n tokens out of the budget; grows its rectangle."""
        grown = budget.rect.add(n)
        budget.left -= grown if self.padded else n
