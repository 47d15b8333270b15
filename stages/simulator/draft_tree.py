"""Speculative drafts as the engines shape them, and what an EAGLE head's passes cost.

**The draft's shape.** vLLM drafts a chain: `speculative.tokens` (k) passes of the head, one
token each, and verifies the k + 1. SGLang drafts a tree with three numbers: `steps` passes
of the head (--speculative-num-steps), each keeping the `topk` best branches of every
node (--speculative-eagle-topk), of which `draft_tokens` (--speculative-num-draft-tokens,
the root included) are verified. A row gets its tokens along one path of the tree, at most
min(steps, draft_tokens - 1) deep: the per-position acceptance (`speculative.acceptance`)
is that of the path, so a tree's wider choice shows as a higher acceptance, as the
engines' published acceptance lengths show it.

**An EAGLE head's passes** (`speculative.method=eagle`: EAGLE, EAGLE-3; one decoder layer
of the target's width with a dense MLP, and the LM head):

- vLLM's chain: k passes, the first over the k + 1 tokens the target verified a row (the
  head reads their hidden states), the others over one token a row; the LM head over
  each row's last token;
- SGLang's tree: a draft-extend pass over the tokens each row accepted (its logits give the
  first step's branches), then steps - 1 passes over `topk` branches a row, the LM head
  over each branch;
- every pass pays the device's `draft_pass_s` besides its roofline: its own launches,
  sampling and tree bookkeeping, which at small batch are most of a pass (fitted to the
  published speed-ups' fitted half, benchmarks/published_speculative.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stages.model.spec import ModelSpec


@dataclass(frozen=True)
class DraftTree:
    """A draft's shape: passes of the head, branches kept a node, tokens verified a row."""

    steps: int
    topk: int = 1
    draft_tokens: int = 0  # 0: steps + 1, the chain's
    chain: bool = True  # vLLM's chain from speculative.tokens (else SGLang's three numbers)

    def __post_init__(self) -> None:
        if self.draft_tokens == 0:
            object.__setattr__(self, "draft_tokens", self.steps + 1)
        check_tree(self.steps, self.topk, self.draft_tokens)

    @property
    def verified(self) -> int:
        """Draft tokens a row verifies beside its own last token."""
        return self.draft_tokens - 1

    @property
    def depth(self) -> int:
        """The most draft tokens a row can accept in one step."""
        return min(self.steps, self.draft_tokens - 1)


def check_tree(steps: int, topk: int, draft_tokens: int) -> None:
    """One-line errors naming the keys, as SGLang's own checks refuse them."""
    for key, value in (("steps", steps), ("topk", topk), ("draft_tokens", draft_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"speculative.{key}={value}: give a whole number, 1 or more")
    if draft_tokens < 2:
        raise ValueError(
            f"speculative.draft_tokens={draft_tokens}: a row verifies its own token and at "
            "least one draft token: 2 or more"
        )
    if topk == 1 and draft_tokens > steps + 1:
        raise ValueError(
            f"speculative.draft_tokens={draft_tokens} with speculative.topk=1: a chain of "
            f"speculative.steps={steps} verifies at most {steps + 1}"
        )
    # The first pass branches topk ways, each later one topk ways from each of topk nodes.
    most = 1 + topk + (steps - 1) * topk * topk
    if draft_tokens > most:
        raise ValueError(
            f"speculative.draft_tokens={draft_tokens}: {steps} steps of topk {topk} draft at "
            f"most {most} tokens (the root included)"
        )


def tree_of(tokens: int, steps: int, topk: int, draft_tokens: int) -> DraftTree:
    """The draft's shape from the keys: SGLang's three numbers where `steps` is set (topk
    and draft_tokens then default to a chain's 1 and steps + 1), else vLLM's chain of
    `tokens`."""
    if steps:
        return DraftTree(steps, topk or 1, draft_tokens or 0, chain=False)
    if topk > 1 or draft_tokens:
        raise ValueError(
            "speculative.topk and speculative.draft_tokens shape a tree of speculative.steps "
            "passes: set speculative.steps too (SGLang's --speculative-num-steps)"
        )
    return DraftTree(tokens)


def head_spec(target: ModelSpec) -> ModelSpec:
    """An EAGLE head: one decoder layer of the target's width and attention, its MLP dense
    (the target's dense width), and the target's LM head."""
    return dataclasses.replace(target, name=f"{target.name}-eagle-head", num_layers=1, moe=None)


def pass_work(tree: DraftTree, rows: float, accepted: float) -> list[tuple[float, float]]:
    """Each of the head's passes for `rows` rows that accept `accepted` tokens a step on
    average (the row's own included): the tokens through its layer and the rows through
    its LM head (a row's last token, or each of its topk branches)."""
    if tree.chain:  # vLLM: the first over the verified tokens, the last of each sampled
        return [(rows * tree.draft_tokens, rows)] + [(rows, rows)] * (tree.steps - 1)
    # SGLang: a draft-extend over the accepted tokens (its logits give the first step's
    # branches), then a pass over topk branches for each further step.
    branches = rows * tree.topk
    return [(rows * accepted, rows)] + [(branches, branches)] * (tree.steps - 1)
