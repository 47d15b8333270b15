"""The ops interface of the paged attention stage: what a device backend must provide.

`attention.ops=cpu` (stages/model/attention/ops_cpu.py) implements it in plain Paddle;
`attention.ops=intel_hpu` (stages/model/attention/ops_intel_hpu.py) binds the Intel HPU plugin's
fused ops. The attention stage calls only these functions, with the tensors of the step's
ForwardMeta, so both backends see the same static shapes. The attention functions end
with the layer's output projection (without its bias), as the HPU's fused ops do.

Shapes: B encoder rows, S padded chunk length (a multiple of the block size `bs`), M
blocks per encoder row (context and chunk, left-aligned), R decoder rows, NB blocks in the
decoder's flattened block list, H query heads, KV key/value heads, D head size. Block
indices past the pool name the scratch block, which only padding reads or writes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np
import paddle

Cache = Any  # a backend's own layout of one layer's keys or values
RopeTable = Any  # a backend's own form of a forward's rotary angles
SlotIndex = Any  # a backend's own form of a step's cache slots
DecodeLayout = Any  # a backend's own form of a step's decode mask and row placement
PrefillLayout = Any  # a backend's own form of a step's prefill rows: lengths and contexts
QkNorm = Any  # a backend's own form of a layer's per-head q/k RMSNorm


class Heads(NamedTuple):
    """A model's attention heads."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    interleaved: bool  # rotary pairs (2i, 2i+1) rather than halves (i, i + D/2)

    @classmethod
    def of(cls, model: Any) -> Heads:
        d = model.spec
        return cls(d.num_heads, d.num_kv_heads, d.head_dim, model.rope_interleaved)


class CompiledDecode(NamedTuple):
    """What the compiled decode layer (stages/model/decode_layer.cc) takes from the
    attention stage for one layer of a decode-only step: the layer's packed int8 QKV and
    caches, in the CPU ops' layouts, and the step's rotary turns, write slots and blocks."""

    qkv: Any  # Int8Weight [out, hidden] in pack_qkv's order
    qkv_bias: paddle.Tensor | None
    k_cache: paddle.Tensor
    v_cache: paddle.Tensor
    step: CompiledStep


class CompiledStep(NamedTuple):
    """A decode-only step's part of CompiledDecode, made once for every layer."""

    cos: paddle.Tensor  # [rows, D / 2]: each rotary pair's turn
    sin: paddle.Tensor
    slot_blocks: paddle.Tensor  # [rows] int64: the block each row's new key and value go to
    slot_offsets: paddle.Tensor  # [rows] int64: their place in it
    block_list: paddle.Tensor  # [NB] int64, as DecodeMeta's
    block_groups: paddle.Tensor  # [NB] int64
    row_slots: paddle.Tensor  # [NB] int64
    block_bias: paddle.Tensor  # [NB, bs]
    padding_place: int  # a row slot at or past it is a padding block's


class AttentionOps(Protocol):
    # Whether qkv_rope can norm each query and key head (Qwen3); a backend without it is
    # refused at start for such a model.
    supports_qk_norm: bool
    # Whether the caches are the CPU ops' layouts, which the compiled decode layer
    # (stages/model/decode_layer.cc) reads and writes.
    compiled_decode: bool
    # Whether the prefill and decode ops take a step's real tokens packed
    # (prefill_layout(..., packed=True)), so the model skips the padding rows in its dense
    # layers; False for a backend that keeps static shapes (the HPU).
    packs_rows: bool

    def new_caches(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str
    ) -> tuple[Cache, Cache]:
        """One layer's zeroed key and value storage for num_blocks blocks (the scratch
        block included); a backend may lay keys out differently from values."""

    def pack_qkv(
        self,
        weight: paddle.Tensor,
        bias: paddle.Tensor | None,
        heads: Heads,
    ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """The fused QKV weight [hidden, (H + 2 KV) D] and bias in the layout this backend's
        qkv_rope takes, made once per layer. A backend may reorder the dims within each
        query and key head (the same order for both, so scores are unchanged); the values
        keep theirs."""

    def pack_qk_norm(
        self, q_weight: paddle.Tensor, k_weight: paddle.Tensor, eps: float, heads: Heads
    ) -> QkNorm:
        """The RMSNorm weights [D] of every query head and every key head, and its epsilon,
        as this backend's qkv_rope takes them, made once per layer: the weights' dims in
        pack_qkv's order (a head's root mean square does not depend on the order)."""

    def rope_table(
        self,
        cos: paddle.Tensor,
        sin: paddle.Tensor,
        heads: Heads,
    ) -> RopeTable:
        """The rotation of a forward's tokens (cos, sin [T, D]; `interleaved` rotates pairs
        (2i, 2i+1) rather than halves) as this backend's qkv_rope applies it: made once per
        forward, shared by every layer."""

    def qkv_rope(
        self,
        x: paddle.Tensor,
        weight: paddle.Tensor,
        bias: paddle.Tensor | None,
        rope: RopeTable,
        heads: Heads,
        qk_norm: QkNorm | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """x [T, hidden] @ weight [hidden, (H + 2 KV) D] (+ bias), as pack_qkv made them, then
        each query and key head RMS-normed if qk_norm (as pack_qk_norm made it), then rotary
        positions on q and k as rope_table made them. Returns q [T, H, D], k [T, KV, D]
        (their dims in pack_qkv's order), v [T, KV, D]."""

    def write_blocks(
        self,
        k_cache: Cache,
        v_cache: Cache,
        block_indices: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
    ) -> None:
        """Block-granular prefill write: k, v [n * bs, KV, D] fill blocks block_indices [n]
        of their caches."""

    def slot_index(
        self, k_cache: Cache, block_indices: paddle.Tensor, block_offsets: paddle.Tensor
    ) -> SlotIndex:
        """Slots (block_indices[i], block_offsets[i]) [n] as this backend's write_slots takes
        them, for caches shaped like k_cache: made once per step, shared by every layer."""

    def write_slots(
        self,
        k_cache: Cache,
        v_cache: Cache,
        slots: SlotIndex,
        k: paddle.Tensor,
        v: paddle.Tensor,
    ) -> None:
        """Slot writes: row i of k, v [n, KV, D] goes to slot i of slot_index's slots."""

    def prefill_layout(
        self, context_lens: np.ndarray, chunk_lens: np.ndarray, dtype: str, packed: bool = False
    ) -> PrefillLayout:
        """The prefill rows' contexts and real lengths [B] as this backend's prefill ops take
        them, made once per step, shared by every layer. A backend that attends the padded
        rectangle whole, with causality or the mask alone, needs none of it. packed (only
        where packs_rows): the prefill ops then take q, k, v [T, heads, D] of the rows' real
        tokens one after another, and give [T, hidden]."""

    def prefill(
        self,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        out_weight: paddle.Tensor,
        layout: PrefillLayout | None = None,
    ) -> paddle.Tensor:
        """A first chunk, causal within the row: q [B, S, H, D], k, v [B, S, KV, D], then
        the output projection out_weight [H * D, hidden] -> [B * S, hidden]. Real tokens
        are a prefix of each row, so causality alone keeps them off the padding; the
        outputs of padding queries are never read, so a backend may skip them (layout
        says where they are)."""

    def prefill_with_context(
        self,
        q: paddle.Tensor,
        k_cache: Cache,
        v_cache: Cache,
        block_list: paddle.Tensor,
        mask: paddle.Tensor,
        out_weight: paddle.Tensor,
        layout: PrefillLayout | None = None,
    ) -> paddle.Tensor:
        """A later chunk (already written to the cache) over its context and itself:
        q [B, S, H, D], block_list [B, M], mask [B, 1, S, M * bs] additive, then the output
        projection -> [B * S, hidden]. Padding queries as in prefill."""

    def decode_layout(
        self,
        block_bias: paddle.Tensor,
        row_slots: paddle.Tensor,
        row_width: int,
        num_rows: int,
        num_heads: int,
    ) -> DecodeLayout:
        """A step's decode masking and row placement as this backend's decode takes them,
        made once per step, shared by every layer: block_bias [NB, bs] additive (0 for a
        filled slot); row_slots [NB] places each block when the rows' blocks are laid side
        by side, row_width blocks a row: row * row_width + the block's index in its row,
        padding blocks num_rows * row_width (a spare row). A backend that combines blocks
        by their maxima, as the HPU's fused op does, needs only the bias."""

    def decode(
        self,
        q: paddle.Tensor,
        k_cache: Cache,
        v_cache: Cache,
        block_list: paddle.Tensor,
        block_groups: paddle.Tensor,
        block_mapping: paddle.Tensor,
        layout: DecodeLayout,
        out_weight: paddle.Tensor,
        block_range: tuple[int, int] | None = None,
    ) -> paddle.Tensor:
        """Flat paged attention, one query per row: q [R, H, D]; block_list [NB] the blocks
        of every row one after another, block_groups [NB] each block's row, block_mapping
        [NB, R] the same as one-hot rows (zero for padding blocks), layout as decode_layout
        made it; then the output projection -> [R, hidden]. block_range (first, end) says
        block_list is the pool's blocks first..end-1 in order, rows' blocks interleaved
        and the others padding: a backend may read that span in place; block_list stays
        valid for one that gathers."""
