"""HPU-style paged attention: a block pool per layer, encoder rows then decoder rows."""

from __future__ import annotations

import paddle

from stages.metadata import ForwardMeta


def load_ops(name: str):
    if name == "cpu":
        from stages.attention import ops_cpu

        return ops_cpu
    if name == "intel_hpu":
        raise ValueError(
            "attention.ops=intel_hpu needs the Intel HPU plugin ops (paddlenlp_ops, built from "
            "PaddleCustomDevice backends/intel_hpu/custom_ops), which this build does not bind "
            "yet: use attention.ops=cpu"
        )
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
        # One block past the pool is scratch: padding rows write there.
        slots = (num_blocks + 1) * block_size
        self.k_cache = [
            self.ops.new_cache(slots, num_kv_heads, head_dim, dtype) for _ in range(num_layers)
        ]
        self.v_cache = [
            self.ops.new_cache(slots, num_kv_heads, head_dim, dtype) for _ in range(num_layers)
        ]

    def forward(
        self, layer: int, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, meta: ForwardMeta
    ) -> paddle.Tensor:
        """q [tokens, heads, dim], k/v [tokens, kv_heads, dim] -> [tokens, heads * dim]."""
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        split = meta.encoder_tokens
        parts = []
        if meta.encoder:
            enc = meta.encoder
            b, s, _ = enc.shape
            k_enc, v_enc = k[:split], v[:split]
            self.ops.write_cache(k_cache, enc.slots, k_enc)
            self.ops.write_cache(v_cache, enc.slots, v_enc)
            q_enc = q[:split].reshape([b, s, *q.shape[1:]])
            if enc.has_context:
                out = self.ops.prefill_with_context(
                    q_enc, k_cache, v_cache, enc.key_slots, enc.mask
                )
            else:
                kv_shape = [b, s, *k.shape[1:]]
                out = self.ops.prefill(
                    q_enc, k_enc.reshape(kv_shape), v_enc.reshape(kv_shape), enc.mask
                )
            parts.append(out.reshape([b * s, -1]))
        if meta.decoder:
            dec = meta.decoder
            self.ops.write_cache(k_cache, dec.slots, k[split:])
            self.ops.write_cache(v_cache, dec.slots, v[split:])
            parts.append(self.ops.decode(q[split:], k_cache, v_cache, dec.key_slots, dec.mask))
        return parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)

    def release(self, request_id: str) -> None:
        """Nothing to do: a finished request's blocks go back to the pool via the scheduler."""
