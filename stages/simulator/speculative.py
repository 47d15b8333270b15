"""Speculative decoding on the simulated device: what a step costs when its decode rows
verify k proposed tokens, and how many tokens a row gets from it.

A step with speculation runs, for its decode rows:

- the verification: the target's forward over k + 1 query tokens per row (its last token
  and the k proposals): the GEMMs and the lm head over (k + 1) x rows tokens, attention of
  query i (0 .. k) of a row over its context and the i proposals before it (the FLOPs of
  k + 1 queries; the row's keys and values read once), KV writes for k + 1 slots; prefill
  rows are as without speculation;
- the proposals, by `method`:
  - mtp: k passes of the model's multi-token-prediction head, each one decoder layer of the
    target (DeepSeek-V3's and ERNIE-4.5's MTP modules are one layer: `mtp_layers`) plus
    the shared lm head, on the rows' one token each, inside the step (no step overhead of
    its own);
  - draft: k decode passes of a draft model (`draft_model`) on the same device and rows,
    each its own forward, so each pays the per-step overhead;
  - ngram: none on the device (prompt lookup runs on the host).

Prompt lookup proposes only where the context's last n tokens occur earlier in it: a share
`proposal_rate` of rows (measured on real generations: benchmarks/spec_acceptance.py)
carries k proposals, the others one token, as vLLM's n-gram proposer leaves a row without
a match unverified. On a device that pads to buckets every row keeps k + 1 slots (its
graph's static shape), so the rate changes nothing there but the tokens.

A proposing row gets E = 1 + sum_{i=1..k} prod_{j<=i} a_j tokens on average (a_j: the
acceptance of position j given a proposal, the last value repeating); a row on average
1 + proposal_rate (E - 1). The proposer's weights and its KV
per token come out of the KV pool (proposer_memory). Left out: the draft's own prefill, and
the proposals' growing context within a step (i extra keys on pass i).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stages.forward.step_shape import StepShape
from stages.model.spec import ModelSpec
from stages.simulator.cost_model import OVERHEAD, RECOMPILE, CostModel
from stages.simulator.draft_tree import DraftTree, head_spec, pass_work, tree_of
from stages.simulator.precision import Precision
from stages.simulator.step_work import StepWork, decode_sums

METHODS = ("mtp", "eagle", "draft", "ngram")


def position_acceptance(acceptance: Sequence[float], tokens: int) -> list[float]:
    """The acceptance of each of `tokens` positions: the list's, its last value repeating."""
    if not acceptance:
        raise ValueError("speculative.acceptance is empty: give at least one value, e.g. [0.8]")
    return [float(acceptance[min(i, len(acceptance) - 1)]) for i in range(tokens)]


def expected_tokens(acceptance: Sequence[float], tokens: int, proposal_rate: float = 1.0) -> float:
    """Tokens a row gets per verification step on average: 1 + sum over positions i of the
    chance that proposals 1 .. i are all accepted, for the share of rows that propose."""
    total, chance = 0.0, 1.0
    for a in position_acceptance(acceptance, tokens):
        chance *= a
        total += chance
    return 1.0 + proposal_rate * total


def check_speculation(
    method: str, tokens: int, acceptance: Sequence[float], draft: str, proposal_rate: float = 1.0
) -> None:
    """One-line errors, each naming its key, for values no speculation can run with."""
    if method not in ("none", *METHODS):
        raise ValueError(f"speculative.method={method}: choose none, {', '.join(METHODS)}")
    if method == "none":
        return
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"speculative.tokens={tokens}: give the proposals per step, 1 or more")
    if not acceptance:
        raise ValueError("speculative.acceptance=[]: give per-position values in [0, 1]")
    bad = [a for a in acceptance if not 0.0 <= float(a) <= 1.0]
    if bad:
        raise ValueError(f"speculative.acceptance has {bad[0]}: each value must be in [0, 1]")
    if not 0.0 < float(proposal_rate) <= 1.0:
        raise ValueError(
            f"speculative.proposal_rate={proposal_rate}: the share of rows that propose, "
            "in (0, 1] (1: every row)"
        )
    if method == "draft" and not draft:
        raise ValueError(
            "speculative.method=draft needs speculative.draft_model (e.g. spec/llama32_1b)"
        )


@dataclass(frozen=True)
class Speculation:
    """What a speculative configuration sets: its method, its k and its acceptance."""

    method: str
    tokens: int
    acceptance: tuple[float, ...]
    mtp_layers: int = 1  # method=mtp: decoder layers in the prediction head
    proposal_rate: float = 1.0  # share of decode rows a step verifies proposals for
    # A tree draft, SGLang's three numbers (0: vLLM's chain of `tokens`): draft_tree.py
    steps: int = 0
    topk: int = 0
    draft_tokens: int = 0

    def __post_init__(self) -> None:
        check_speculation(self.method, self.tokens, self.acceptance, "-", self.proposal_rate)
        if self.method == "none":
            raise ValueError("Speculation is for a method other than none")
        if self.mtp_layers < 1:
            raise ValueError(f"speculative.mtp_layers={self.mtp_layers}: 1 or more")
        tree = tree_of(self.tokens, self.steps, self.topk, self.draft_tokens)
        if not tree.chain and self.method != "eagle":
            raise ValueError(
                f"speculative.steps, topk and draft_tokens shape an EAGLE head's tree: set "
                f"speculative.method=eagle (not {self.method}), or speculative.tokens alone"
            )

    @property
    def tree(self) -> DraftTree:
        return tree_of(self.tokens, self.steps, self.topk, self.draft_tokens)

    @property
    def verified(self) -> int:
        """Draft tokens a proposing row verifies a step beside its own."""
        return self.tree.verified

    @property
    def expected_tokens(self) -> float:
        return expected_tokens(self.acceptance, self.tree.depth, self.proposal_rate)


def verify_extra(rows: float, tokens: int) -> StepWork:
    """The work `tokens` proposals per proposing decode row add to a step of `rows` such
    rows, besides their attention: each proposal goes through the GEMMs and the lm head
    and writes its KV slot."""
    k = tokens
    return StepWork(linear_tokens=rows * k, kv_writes=rows * k, sampled_rows=rows * k)


def verify_pairs(rows: float, slots: float, tokens: int) -> float:
    """The query-key pairs `tokens` proposals per row add to decode attention over `slots`
    KV slots of `rows` proposing rows: proposal i attends to its row's context and to the
    i proposals up to itself, k x context + k (k + 1) / 2 per row. The keys are read once
    for all of a row's queries (as a decode attention kernel reads a row's blocks once for
    its k + 1 queries), so only the FLOPs grow."""
    k = tokens
    return k * slots + rows * k * (k + 1) / 2


class SpeculativeCost:
    """Seconds of a step with speculation, from the target's cost model (and the draft
    model's, for method=draft)."""

    def __init__(
        self, target: CostModel, speculation: Speculation, draft: ModelSpec | None = None
    ) -> None:
        if (speculation.method == "draft") != (draft is not None):
            raise ValueError("speculative.draft_model goes with speculative.method=draft alone")
        self.target, self.speculation = target, speculation
        self.draft = (
            CostModel(draft, target.hardware, target.tp, precision=target.precision)
            if draft is not None
            else None
        )
        self.head = (
            CostModel(
                head_spec(target.spec), target.hardware, target.tp, precision=target.precision
            )
            if speculation.method == "eagle"
            else None
        )

    def decode_rows(self, shape: StepShape) -> tuple[int, int]:
        """The decode rows the device computes and the KV slots they read: the padded
        bucket's on a padding device, the real rows' otherwise."""
        if shape.decode is None:
            return 0, 0
        if self.target.hardware.pads_to_buckets:
            rows, blocks = shape.decode
            return rows, blocks * shape.block_size
        rows, slots, _ = decode_sums(shape)
        return rows, slots

    def verify_seconds(self, shape: StepShape) -> float:
        """The target's step with k + 1 tokens per proposing decode row (every row on a
        padding device), compiles included."""
        target = self.target
        rows, slots = self.decode_rows(shape)
        k = self.speculation.verified
        share = 1.0 if target.hardware.pads_to_buckets else self.speculation.proposal_rate
        amounts = target.amounts_of(target.work(shape) + verify_extra(share * rows, k))
        pairs = verify_pairs(share * rows, share * slots, k)
        amounts.decode_attention_flops += target.spec.attention_flops(pairs, target.tp)
        recompile = target.hardware.recompile_s if shape.miss else 0.0
        return float(target.seconds_of(amounts)) + recompile

    def propose_seconds(self, shape: StepShape) -> float:
        """The k proposals' seconds for the step's decode rows (0 without any)."""
        if shape.decode is None or not self.decode_rows(shape)[0]:
            return 0.0
        decode = StepShape(
            shape.block_size,
            None,
            shape.decode,
            decode_lens=shape.decode_lens,
            decode_kv=shape.decode_kv,
        )
        k, method = self.speculation.tokens, self.speculation.method
        if method == "draft":
            assert self.draft is not None
            return k * self.draft.step_time(decode)
        if method == "mtp":
            return k * self.mtp_pass_seconds(decode)
        if method == "eagle":
            return self.eagle_seconds(decode)
        return 0.0

    def eagle_seconds(self, decode: StepShape) -> float:
        """An EAGLE head's passes over a decode-only step's rows (draft_tree.pass_tokens):
        each one layer and the LM head over its tokens, reading the rows' context once, and
        the device's fixed time of a pass."""
        assert self.head is not None
        head, speculation = self.head, self.speculation
        rows, slots = self.decode_rows(decode)
        blocks = decode_sums(decode)[2] if not head.hardware.pads_to_buckets else 0
        accepted = speculation.expected_tokens
        total = 0.0
        for tokens, sampled in pass_work(speculation.tree, rows, accepted):
            work = StepWork(tokens, 0, 0, slots, tokens, sampled, blocks)
            total += float(head.seconds_of(head.amounts_of(work))) - head.coefficients[OVERHEAD]
            total += head.hardware.draft_pass_s
        return total

    def mtp_pass_seconds(self, decode: StepShape) -> float:
        """One pass of the prediction head over a decode-only step's rows: `mtp_layers` of
        the target's layers (each term but the lm head is the same for every layer) and
        the lm head."""
        parts = self.target.breakdown(decode)
        head = parts.pop("lm_head")
        for fixed in (OVERHEAD, RECOMPILE):
            parts.pop(fixed)
        layers = self.speculation.mtp_layers / self.target.spec.num_layers
        return layers * sum(parts.values()) + head

    def step_time(self, shape: StepShape) -> float:
        """A step's seconds: verification and proposals (the step as it is without decode
        rows)."""
        return self.verify_seconds(shape) + self.propose_seconds(shape)


def accepted_extra(steps: int, expected: float) -> int:
    """Tokens beyond the one it always gets that a row gets at its `steps`-th verification
    step, by fractional credit: E - 1 accrues each step and whole tokens are handed out as
    they accrue, so after n steps a row has exactly floor(n (E - 1)) extra tokens (the
    expected count, deterministic, no draw)."""
    gain = expected - 1.0
    return math.floor(steps * gain + 1e-9) - math.floor((steps - 1) * gain + 1e-9)


def _kv_token_bytes(spec: ModelSpec, tp: int, precision: Precision) -> float:
    """Bytes one token's keys and values take in every layer of `spec` on one device."""
    return spec.kv_bytes_per_token(tp) * precision.kv_bytes(spec.dtype_bytes) / spec.dtype_bytes


def proposer_memory(
    speculation: Speculation,
    target: ModelSpec,
    draft: ModelSpec | None,
    tp: int,
    precision: Precision,
) -> tuple[float, float]:
    """Bytes of weights and of KV per token the proposer holds on one device: a draft
    model's own (its whole weights, its KV cache beside the target's); a prediction head's
    `mtp_layers` layers (each the mean of the target's layers and embedding tables: a little
    more than a layer alone); nothing for prompt lookup."""
    if speculation.method == "draft":
        assert draft is not None
        return precision.model_weight_bytes(draft, tp), _kv_token_bytes(draft, tp, precision)
    if speculation.method == "eagle":
        head = head_spec(target)
        return precision.model_weight_bytes(head, tp), _kv_token_bytes(head, tp, precision)
    if speculation.method == "mtp":
        share = speculation.mtp_layers / target.num_layers
        weights = precision.model_weight_bytes(target, tp)
        return share * weights, share * _kv_token_bytes(target, tp, precision)
    return 0.0, 0.0


def pool_with_proposer(
    blocks: int, block_size: int, target_kv: float, weights: float, kv: float
) -> int:
    """The KV blocks left when a proposer's `weights` bytes come out of a pool of `blocks`
    blocks (of `target_kv` bytes a token) and each token also holds the proposer's `kv`
    bytes."""
    free = blocks * block_size * target_kv - weights
    left = int(free // (block_size * (target_kv + kv)))
    if left < 1:
        raise ValueError(
            f"the proposer's {weights / 2**30:.1f} GiB of weights leave no KV block: "
            "choose a smaller speculative.draft_model, raise tp or a larger device"
        )
    return left
