"""HPU-style paged attention: a block pool per layer, encoder rows then decoder rows."""

from __future__ import annotations

from collections.abc import Callable

import paddle

from stages.attention.interface import AttentionOps
from stages.metadata import ForwardMeta


def load_ops(name: str) -> AttentionOps:
    """The backend of attention.ops; ValueError (one line) when it cannot be loaded."""
    if name == "cpu":
        from stages.attention import ops_cpu

        return ops_cpu
    if name == "intel_hpu":
        from stages.attention import ops_intel_hpu

        return ops_intel_hpu.load()
    raise ValueError(f"attention.ops={name}: choose attention.ops=cpu or intel_hpu")


class PagedAttention:
    """Owns the KV cache tensors; the scheduler owns which blocks each request holds."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        ops: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        self.ops = load_ops(ops)
        self._packed: dict[int, tuple] = {}  # id(weight) -> (weight, packed weight, bias)
        # A forward's rotary table, slot indices and decode layout, made at its first layer
        # for them all: purpose -> (the tensor they were made from, held so its id is never
        # reused, what was made).
        self._per_step: dict[str, tuple[paddle.Tensor, object]] = {}
        # One block past the pool is scratch: padding rows write there.
        caches = [
            self.ops.new_caches(num_blocks + 1, block_size, num_kv_heads, head_dim, dtype)
            for _ in range(num_layers)
        ]
        self.k_cache = [k for k, _ in caches]
        self.v_cache = [v for _, v in caches]

    def qkv_rope(
        self,
        x: paddle.Tensor,
        weight: paddle.Tensor,
        bias: paddle.Tensor | None,
        cos: paddle.Tensor,
        sin: paddle.Tensor,
        *heads: int | bool,
        qk_norm: tuple[paddle.Tensor, paddle.Tensor, float] | None = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """AttentionOps.qkv_rope on the layer's weight, packed once into the backend's
        layout; `heads` are num_heads, num_kv_heads, head_dim and interleaved; qk_norm
        (q weight, k weight, eps), when the model norms heads, is packed with the weight."""
        packed = self._packed.get(id(weight))
        if packed is None or packed[0] is not weight:  # held, so an id is never reused
            norm = None if qk_norm is None else self.ops.pack_qk_norm(*qk_norm, *heads)
            packed = (weight, *self.ops.pack_qkv(weight, bias, *heads), norm)
            self._packed[id(weight)] = packed
        rope = self._once("rope", cos, lambda: self.ops.rope_table(cos, sin, *heads))
        if packed[3] is None:  # the call of models without q/k norms stays as it was
            return self.ops.qkv_rope(x, packed[1], packed[2], rope, *heads)
        return self.ops.qkv_rope(x, packed[1], packed[2], rope, *heads, qk_norm=packed[3])

    def _once(self, purpose: str, source: paddle.Tensor, make: Callable[[], object]) -> object:
        """make(), unless it was made from this very tensor for this purpose already."""
        made = self._per_step.get(purpose)
        if made is None or made[0] is not source:
            made = (source, make())
            self._per_step[purpose] = made
        return made[1]

    def forward(
        self,
        layer: int,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        meta: ForwardMeta,
        out_weight: paddle.Tensor,
    ) -> paddle.Tensor:
        """q [tokens, heads, dim], k/v [tokens, kv_heads, dim] -> attention through the
        output projection out_weight, [tokens, hidden]: encoder rows, then decoder rows."""
        ops, k_cache, v_cache = self.ops, self.k_cache[layer], self.v_cache[layer]
        split = meta.encoder_tokens
        parts = []
        if meta.encoder:
            enc = meta.encoder
            b, s, _ = enc.shape
            k_enc, v_enc = k[:split], v[:split]
            if enc.block_indices is not None:
                ops.write_blocks(k_cache, v_cache, enc.block_indices, k_enc, v_enc)
            else:
                slots = self._once(
                    "encoder slots",
                    enc.slot_blocks,
                    lambda: ops.slot_index(k_cache, enc.slot_blocks, enc.slot_offsets),
                )
                ops.write_slots(k_cache, v_cache, slots, k_enc, v_enc)
            q_enc = q[:split].reshape([b, s, *q.shape[1:]])
            if enc.has_context:
                out = ops.prefill_with_context(
                    q_enc, k_cache, v_cache, enc.block_list, enc.mask, out_weight
                )
            else:
                kv_shape = [b, s, *k.shape[1:]]
                out = ops.prefill(
                    q_enc, k_enc.reshape(kv_shape), v_enc.reshape(kv_shape), out_weight
                )
            parts.append(out)
        if meta.decoder:
            dec = meta.decoder
            slots = self._once(
                "decoder slots",
                dec.block_indices,
                lambda: ops.slot_index(k_cache, dec.block_indices, dec.block_offsets),
            )
            ops.write_slots(k_cache, v_cache, slots, k[split:], v[split:])
            layout = self._once(
                "decode layout",
                dec.block_bias,
                lambda: ops.decode_layout(
                    dec.block_bias, dec.row_slots, dec.row_width, dec.shape[0], q.shape[1]
                ),
            )
            parts.append(
                ops.decode(
                    q[split:],
                    k_cache,
                    v_cache,
                    dec.block_list,
                    dec.block_groups,
                    dec.block_mapping,
                    layout,
                    out_weight,
                    dec.block_range,
                )
            )
        return parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)

    def release(self, request_id: str) -> None:
        """Nothing to do: a finished request's blocks go back to the pool via the scheduler."""
