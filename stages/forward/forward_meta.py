"""The forward metadata's value types: a step plan as the metadata builder lays it out in
the static, padded shapes an HPU executes (PrefillMeta, DecodeMeta, ForwardMeta), the
additive masks' score for a hidden key, and the bucket labels steps.jsonl records.

The prefill part (FastDeploy's "encoder" part) holds the step's prefill chunks as a
rectangle [batch, seq]; the decode part (FastDeploy's "decoder" part) holds one token per
decoding request. stages/forward/metadata.py builds them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from stages.forward.step_shape import StepShape
from stages.scheduling.request import PromptSpan, StepMode

if TYPE_CHECKING:
    import paddle

    from stages.scheduling.request import StepPlan

# The additive mask's score for a key a query must not see. Finite, not -inf: a row that
# sees no key (padding) then softmaxes to finite weights, which its zero output discards.
MASKED_SCORE = -1e30


@dataclass
class PrefillMeta:
    batch: int  # real rows
    shape: tuple[int, int, int]  # (batch, seq, blocks) after padding
    seq_ids: list[int]  # each real row's request (its internal sequence number)
    # [batch, seq]; packed: [num_tokens], the rows' real tokens one row after another
    input_ids: np.ndarray
    positions: np.ndarray  # as input_ids
    context_lens: np.ndarray  # [batch] tokens already cached before this chunk
    chunk_lens: np.ndarray  # [batch] real tokens of this chunk
    num_tokens: int  # real tokens, chunk_lens' sum
    # Every chunk starts on a block boundary: the cache is written in whole blocks,
    # block_indices [batch * seq / block_size] naming each block's destination. Otherwise
    # token by token, at (slot_blocks, slot_offsets) [batch * seq]. Packed: the blocks that
    # hold tokens only, filled from the packed rows block_rows [blocks * block_size] (a
    # last block's tail repeats its row's last token, masked until later tokens overwrite
    # it), and the real tokens' slots only.
    block_indices: paddle.Tensor | None
    slot_blocks: paddle.Tensor | None
    slot_offsets: paddle.Tensor | None
    has_context: bool
    block_list: paddle.Tensor | None  # [batch, blocks] context then chunk blocks, left-aligned
    # [batch, 1, seq, blocks * block_size] additive, with context; None where packed (the
    # packed ops read each row's context and length instead)
    mask: paddle.Tensor | None
    block_rows: paddle.Tensor | None = None


@dataclass
class DecodeMeta:
    batch: int
    shape: tuple[int, int]  # (batch, blocks): rows and flattened block list after padding
    rows: int  # rows laid out: the bucket's, or the real ones where packed
    seq_ids: list[int]
    input_ids: np.ndarray  # [rows]
    positions: np.ndarray  # [rows]
    block_indices: paddle.Tensor  # [rows] block of the slot each row writes
    block_offsets: paddle.Tensor  # [rows] offset of that slot in its block
    block_list: paddle.Tensor  # [blocks] every row's blocks, one row after another
    block_groups: paddle.Tensor  # [blocks] the row owning each block (padding: the last)
    block_mapping: paddle.Tensor  # [blocks, rows] one-hot block -> row, zero for padding
    block_bias: paddle.Tensor  # [blocks, block_size] additive: 0 for a filled slot
    # [blocks] each block's place with rows side by side, row_width blocks a row:
    # row * row_width + its index in the row; padding blocks batch * row_width, a spare row.
    row_slots: paddle.Tensor
    row_width: int  # the most blocks any row has
    # (first, end) when block_list is the pool's blocks first..end-1 in order (a span,
    # other requests' and free blocks masked as padding) rather than listed row by row.
    block_range: tuple[int, int] | None = None


@dataclass
class ForwardMeta:
    mode: StepMode
    prefill: PrefillMeta | None
    decode: DecodeMeta | None
    # None when the builder lays out shapes only (a simulated device needs no tensors).
    input_ids: paddle.Tensor | None  # [tokens] prefill rows flattened, then decode rows
    positions: paddle.Tensor | None  # [tokens]
    logits_rows: paddle.Tensor | None  # last real token of each chunk, then every decode row
    num_tokens: int
    padded_tokens: int
    shape: StepShape  # the buckets and real lengths: what a cost model reads
    # Each part's dims before padding to its bucket (what a bucket plan is chosen from):
    # prefill [batch, seq, blocks per row], decode [batch, blocks listed or spanned].
    needed: dict[str, list[int]] = field(default_factory=dict)
    # The step's real tokens only, laid out for a backend that attends packed rows (the
    # CPU's): input_ids, positions and logits_rows then skip the padding rows.
    packed: bool = False
    # Prompt positions whose logits are asked for (prompt log-probabilities): their rows
    # follow the samples' in logits_rows, so the same forward computes them. Empty: none.
    prompt_spans: list[PromptSpan] = field(default_factory=list)

    @classmethod
    def of_shapes(
        cls,
        mode: StepMode,
        num_tokens: int,
        padded_tokens: int,
        shape: StepShape,
        needed: dict[str, list[int]],
    ) -> ForwardMeta:
        """A step laid out as its shapes alone, without parts or tensors (a simulated
        device's every step: positional, as keywords cost several times more here)."""
        return cls(mode, None, None, None, None, None, num_tokens, padded_tokens, shape, needed)

    @property
    def bucket(self) -> str:
        """steps.jsonl's `bucket` (bucket_label): made when read, as a probe never does."""
        return bucket_label(self.shape.prefill, self.shape.decode)

    @property
    def prefill_tokens(self) -> int:
        """Rows of the prefill part: the first this many of input_ids."""
        if self.prefill is None:
            return 0
        if self.packed:
            return self.prefill.num_tokens
        return self.prefill.shape[0] * self.prefill.shape[1]


@functools.lru_cache(maxsize=4096)  # a run's steps pad to few buckets: each label made once
def bucket_label(prefill: tuple | None, decode: tuple | None) -> str:
    """steps.jsonl's `bucket`: e.g. "prefill 2x256x4 + decode 8x24"."""
    parts = [f"prefill {'x'.join(map(str, prefill))}"] if prefill else []
    parts += [f"decode {'x'.join(map(str, decode))}"] if decode else []
    return " + ".join(parts)


def bucket_dims(label: str) -> tuple[tuple | None, tuple | None]:
    """The padded (prefill, decode) dims of steps.jsonl's `bucket`, e.g.
    "prefill 2x256x4 + decode 8x24", as bucket_label writes it."""
    parts: dict[str, tuple] = {}
    for part in label.split(" + "):
        kind, _, dims = part.partition(" ")
        size = {"prefill": 3, "decode": 2}.get(kind)
        numbers = dims.split("x")
        if size != len(numbers) or kind in parts or not all(n.isdigit() for n in numbers):
            raise ValueError(f"bucket {label!r} is not 'prefill AxBxC + decode DxE'")
        parts[kind] = tuple(int(n) for n in numbers)
    return parts.get("prefill"), parts.get("decode")


def decode_lens(plan: StepPlan) -> np.ndarray:
    """Each decode row's tokens with its new one: the scheduler's array when it made one."""
    if plan.decode_lens is not None:
        return plan.decode_lens
    return np.array([r.num_tokens for r in plan.decode], dtype=np.int64)


def step_shape(
    block_size: int,
    plan: StepPlan,
    prefill: tuple[int, int, int] | None,
    decode: tuple[int, int] | None,
    lens: np.ndarray,
    kv: tuple[int, int] | None = None,
) -> StepShape:
    """The step's buckets and each row's real lengths (lens: decode_lens(plan); kv: their
    decode_totals, where the caller summed them)."""
    chunks = plan.prefill
    chunk_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    if len(chunks) == 1:  # the common step's one chunk, without the comprehensions
        chunk_lens, context_lens = (chunks[0].end - chunks[0].start,), (chunks[0].start,)
    else:  # list comprehensions: a step's few chunks, read fast
        chunk_lens = tuple([c.end - c.start for c in chunks])
        context_lens = tuple([c.start for c in chunks])
    return StepShape(block_size, prefill, decode, chunk_lens, context_lens, lens, False, kv)
