"""HPU-style paged attention: a block pool per layer, prefill rows then decode rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import paddle

from stages.device import Device
from stages.forward.forward_meta import ForwardMeta
from stages.model.attention.interface import (
    AttentionOps,
    CompiledDecode,
    CompiledStep,
    DecodeLayout,
    Heads,
    PrefillLayout,
    RopeTable,
    SlotIndex,
)
from stages.model.int8_weight import Int8Weight
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request


def load_ops(name: str) -> AttentionOps:
    """The backend of attention.ops; ValueError (one line) when it cannot be loaded."""
    if name == Device.cpu:
        from stages.model.attention import ops_cpu

        return ops_cpu
    if name == Device.intel_hpu:
        from stages.model.attention import ops_intel_hpu

        return ops_intel_hpu.load()
    raise ValueError(f"attention.ops={name}: choose attention.ops=cpu or intel_hpu")


@dataclass
class StepState:
    """What every layer of one forward shares, made once by `prepare` in the backend's form."""

    meta: ForwardMeta
    rope: RopeTable | None
    prefill_slots: SlotIndex | None  # token slots of an unaligned prefill
    prefill_layout: PrefillLayout | None  # the prefill rows' real lengths and contexts
    decode_slots: SlotIndex | None  # each decode row's write slot
    decode_layout: DecodeLayout | None  # the decode's mask and row placement
    compiled: CompiledStep | None = None  # a decode-only step's, where the ops take it
    # (cos, sin) while the parts above are still to make (prepare's _op_by_op)
    angles: tuple[paddle.Tensor, paddle.Tensor] | None = None


class PagedAttention:
    """Owns the KV cache tensors; the KV-cache manager owns which blocks each request holds."""

    supports_prefix_caching = True  # requests may share a cached prefix's blocks

    def __init__(
        self,
        kv_cache: KVCacheManager,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        ops: str,
        dtype: str,
    ) -> None:
        self.ops = load_ops(ops)
        caches = [
            self.ops.new_caches(
                kv_cache.num_cache_blocks, kv_cache.block_size, num_kv_heads, head_dim, dtype
            )
            for _ in range(num_layers)
        ]
        self.k_cache = [k for k, _ in caches]
        self.v_cache = [v for _, v in caches]
        self.heads: Heads | None = None
        self._qkv: list[tuple[paddle.Tensor, paddle.Tensor | None]] = []
        self._qk_norm: list[Any] = []  # per layer: the backend's q/k norm, or None
        self._compiles = False  # whether a decode-only step may run compiled (load_weights)

    def load_weights(self, model: Any) -> None:
        """Each layer's QKV weight and bias (and q/k norm, if any) in the backend's layout,
        made once; ValueError when the backend cannot run the model's q/k norm."""
        self.heads = Heads.of(model)
        self._qkv = [
            self.ops.pack_qkv(layer.qkv, layer.qkv_bias, self.heads) for layer in model.layers
        ]
        # The compiled decode layer takes the ops' caches and an int8 QKV without q/k norms.
        self._compiles = self.ops.compiled_decode and all(
            isinstance(layer.qkv, Int8Weight) and layer.q_norm is None for layer in model.layers
        )
        self._qk_norm = [
            None
            if layer.q_norm is None
            else self.ops.pack_qk_norm(layer.q_norm, layer.k_norm, model.rms_eps, self.heads)
            for layer in model.layers
        ]

    @property
    def packs_rows(self) -> bool:
        """Whether the backend attends a step's real tokens packed (the CPU's ops): the
        metadata builder then lays out those alone, and every layer runs on them."""
        return self.ops.packs_rows

    def prepare(self, meta: ForwardMeta, cos: paddle.Tensor, sin: paddle.Tensor) -> StepState:
        """The step's write slots, layouts and rotary table, made once for every layer; for
        a step the compiled decode layer may run (CompiledDecode), its inputs, and the
        rest only when a layer first asks for it (_op_by_op)."""
        prefill, decode = meta.prefill, meta.decode
        if self._compiles and prefill is None and decode is not None and meta.packed:
            compiled = self._compiled_step(meta, cos, sin)
            return StepState(meta, None, None, None, None, None, compiled, (cos, sin))
        state = StepState(meta, None, None, None, None, None)
        self._prepare_op_by_op(state, cos, sin)
        return state

    def _prepare_op_by_op(self, state: StepState, cos: paddle.Tensor, sin: paddle.Tensor) -> None:
        """The state the ops one by one take: write slots, layouts, the rotary table."""
        ops, k_cache = self.ops, self.k_cache[0]  # every layer's cache has one shape
        meta = state.meta
        prefill, decode = meta.prefill, meta.decode
        if prefill is not None:
            dtype = str(cos.dtype).split(".")[-1]
            lens = prefill.chunk_lens
            if meta.packed:
                layout = ops.prefill_layout(prefill.context_lens, lens, dtype, packed=True)
            else:
                layout = ops.prefill_layout(prefill.context_lens, lens, dtype)
            state.prefill_layout = layout
            if prefill.block_indices is None:  # an unaligned prefill writes token by token
                slots = ops.slot_index(k_cache, prefill.slot_blocks, prefill.slot_offsets)
                state.prefill_slots = slots
        if decode is not None:
            state.decode_slots = ops.slot_index(k_cache, decode.block_indices, decode.block_offsets)
            state.decode_layout = ops.decode_layout(
                decode.block_bias,
                decode.row_slots,
                decode.row_width,
                decode.rows,
                self.heads.num_heads,
            )
        state.rope = ops.rope_table(cos, sin, self.heads)
        state.angles = None

    def _op_by_op(self, state: StepState) -> StepState:
        """The state with the op-by-op parts made, where prepare left them for later."""
        if state.angles is not None:
            self._prepare_op_by_op(state, *state.angles)
        return state

    def _compiled_step(self, meta: ForwardMeta, cos: paddle.Tensor, sin: paddle.Tensor):
        """The step's part of CompiledDecode: each rotary pair's angle once (cos and sin
        [T, D] hold it twice: the pairs (2i, 2i+1) or (i, i + D/2))."""
        decode, half = meta.decode, self.heads.head_dim // 2
        if self.heads.interleaved:
            cos, sin = cos[:, 0::2], sin[:, 0::2]
        else:
            cos, sin = cos[:, :half], sin[:, :half]

        def int64(t: paddle.Tensor) -> paddle.Tensor:
            return t if t.dtype == paddle.int64 else t.astype("int64")

        return CompiledStep(
            cos.contiguous(),
            sin.contiguous(),
            int64(decode.block_indices),
            int64(decode.block_offsets),
            int64(decode.block_list),
            int64(decode.block_groups),
            int64(decode.row_slots),
            decode.block_bias,
            decode.rows * decode.row_width,
        )

    def compiled_decode(self, layer: int, state: StepState) -> CompiledDecode | None:
        """The layer's part of the compiled decode layer's inputs, where the step is
        decode-only, the ops' caches are the layouts it takes, and the layer's QKV is int8
        without q/k norms; None where the layer takes the ops one by one."""
        weight, bias = self._qkv[layer]
        if state.compiled is None:
            return None
        step = state.compiled
        return CompiledDecode(weight, bias, self.k_cache[layer], self.v_cache[layer], step)

    def qkv_rope(
        self, layer: int, x: paddle.Tensor, state: StepState
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        weight, bias = self._qkv[layer]
        norm = self._qk_norm[layer]
        state = self._op_by_op(state)
        if norm is None:  # a backend without q/k norms is called as it always was
            return self.ops.qkv_rope(x, weight, bias, state.rope, self.heads)
        return self.ops.qkv_rope(x, weight, bias, state.rope, self.heads, qk_norm=norm)

    def attend(
        self,
        layer: int,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        state: StepState,
        out_weight: paddle.Tensor,
    ) -> paddle.Tensor:
        """q [tokens, heads, dim], k/v [tokens, kv_heads, dim] -> attention through the
        output projection out_weight, [tokens, hidden]: prefill rows, then decode rows (of
        the real tokens only where state.packed)."""
        split = state.meta.prefill_tokens
        state = self._op_by_op(state)
        parts = []
        if state.meta.prefill:
            parts.append(self._prefill(layer, q[:split], k[:split], v[:split], state, out_weight))
        if state.meta.decode:
            if split:  # a decode-only step takes its tensors whole: three slices fewer a layer
                q, k, v = q[split:], k[split:], v[split:]
            parts.append(self._decode(layer, q, k, v, state, out_weight))
        return parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)

    def _prefill(self, layer: int, q, k, v, state: StepState, out_weight) -> paddle.Tensor:
        ops, k_cache, v_cache = self.ops, self.k_cache[layer], self.v_cache[layer]
        meta = state.meta.prefill
        b, s, _ = meta.shape
        if meta.block_rows is not None:  # packed rows fill the blocks they write
            rows = meta.block_rows
            ops.write_blocks(
                k_cache, v_cache, meta.block_indices, paddle.gather(k, rows), paddle.gather(v, rows)
            )
        elif state.prefill_slots is None:
            ops.write_blocks(k_cache, v_cache, meta.block_indices, k, v)
        else:
            ops.write_slots(k_cache, v_cache, state.prefill_slots, k, v)
        if not state.meta.packed:
            q = q.reshape([b, s, *q.shape[1:]])
            k, v = (t.reshape([b, s, *t.shape[1:]]) for t in (k, v))
        if meta.has_context:
            return ops.prefill_with_context(
                q, k_cache, v_cache, meta.block_list, meta.mask, out_weight, state.prefill_layout
            )
        return ops.prefill(q, k, v, out_weight, state.prefill_layout)

    def _decode(self, layer: int, q, k, v, state: StepState, out_weight) -> paddle.Tensor:
        ops, k_cache, v_cache = self.ops, self.k_cache[layer], self.v_cache[layer]
        meta = state.meta.decode
        ops.write_slots(k_cache, v_cache, state.decode_slots, k, v)
        return ops.decode(
            q,
            k_cache,
            v_cache,
            meta.block_list,
            meta.block_groups,
            meta.block_mapping,
            state.decode_layout,
            out_weight,
            meta.block_range,
        )

    def release(self, request: Request) -> None:
        """Nothing to do: a finished request's blocks go back to the pool via the KV-cache
        manager."""
