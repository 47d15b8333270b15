"""The ops interface on Intel Gaudi: the fused ops of the paddle-custom-device plugin.

The ops come from `paddlenlp_ops`, the Python package built from PaddleCustomDevice
`backends/intel_hpu/custom_ops`; FastDeploy's HPU attention backend calls the same ops
(`fastdeploy/model_executor/layers/backends/intel_hpu/attention/hpu_attn_backend.py`).
The binding has been checked only against a recording stand-in of that package, never on
HPU hardware. Signatures follow the op definitions (`PD_BUILD_OP`) in
`custom_ops/llama_infer/*.cc` and `custom_ops/src/index_copy.cc` and the op tests in
`custom_ops/tests/`; later plugin versions add optional quantisation scales to several ops.

Which op each function calls:
- `new_caches`: none; `[num_blocks, block_size, kv_heads, head_dim]` zeros for keys and
  values alike, the layout of FastDeploy's `get_kv_cache_shape`.
- `qkv_rope`: `fused_qkv_rope`, every token as one batch row (`total_batch=1`),
  `transpose=False` (weight `[hidden, (H + 2 KV) D]`, as FastDeploy passes it).
- `write_blocks`: `index_copy_` on the block axis (`dim=0`), as `forward_extend` writes a
  chunk.
- `write_slots`: no plugin op writes slots alone (`fused_block_attention` does it inside);
  Paddle's `index_put_` with (block, offset) pairs, which the plugin implements in place
  (`backends/intel_hpu/kernels/index_put_kernel.cc`).
- `prefill`: `fused_sdpa_proj_t` with `causal=True` and no mask.
- `prefill_with_context`: context blocks gathered by `index_select`, then
  `fused_sdpa_proj_t` with `causal=False` and the explicit mask, as `forward_extend` does.
- `decode`: `fused_flatpa_proj`, flat paged attention over the block list.

Conventions inferred from the sources (none confirmed on hardware):
- The plugin fuses the output projection into attention (`fused_sdpa_proj_t`,
  `fused_flatpa_proj`); the interface's attention functions take the layer's output
  weight `[H * D, hidden]` for it, passed as `linear_weights`.
- Rotary tables are `[2, batch, seq, 1, head_dim]`, cos at 0 and sin at 1, in the
  activations' dtype (the layout the BSHD ops take in `tests/test_rms_qkv_rope.py`).
  `use_neox_style=True` rotates halves (the kernel's BLOCKWISE mode), False rotates pairs.
- The fused ops are compiled for bfloat16 and float16 only: run the model in one of them.
- `fused_sdpa_proj_t` adds the mask only on its grouped-query path, where queries are
  `[B, KV, G, S, D]`, so the mask gets a group axis, `[B, 1, 1, S, K]`, as FastDeploy's
  `get_attention_mask` builds it. The version read ignores the mask when H == KV.
- `fused_flatpa_proj` takes queries `[R, 1, H, D]`, `block_groups` before `block_list`,
  int32 indices and `block_mapping` / `block_bias` in the queries' dtype
  (`tests/test_flatPA_proj.py`).
"""

from __future__ import annotations

import importlib
from typing import Any

import paddle

from stages.model.attention.interface import Cache, Heads

INSTALL_HINT = (
    "attention.ops=intel_hpu needs the Intel HPU plugin: install paddle-custom-device for "
    "intel_hpu and the paddlenlp_ops custom ops built from PaddleCustomDevice "
    "backends/intel_hpu/custom_ops"
)


def load() -> IntelHPUOps:
    """The backend over the installed plugin ops; ValueError naming what to install."""
    try:
        plugin = importlib.import_module("paddlenlp_ops")
    except ImportError as err:
        raise ValueError(f"{INSTALL_HINT} (import paddlenlp_ops: {err})") from err
    return IntelHPUOps(plugin)


QK_NORM_REFUSAL = (
    "attention.ops=intel_hpu has no fused q/k norm, which this model needs (per-head "
    "RMSNorm of queries and keys, as in Qwen3): set attention.ops=cpu"
)


class IntelHPUOps:
    """The ops interface over `plugin`, the `paddlenlp_ops` module or a stand-in for it."""

    # fused_qkv_rope has no per-head norm between the projection and the rotation.
    supports_qk_norm = False
    packs_rows = False  # the HPU keeps static shapes: the padded rows run
    compiled_decode = False  # its caches live on the device, in its own layout

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin

    def pack_qk_norm(self, *args: Any) -> None:
        raise ValueError(QK_NORM_REFUSAL)

    def new_caches(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str
    ) -> tuple[Cache, Cache]:
        shape = [num_blocks, block_size, num_kv_heads, head_dim]
        return paddle.zeros(shape, dtype=dtype), paddle.zeros(shape, dtype=dtype)

    def pack_qkv(
        self,
        weight: paddle.Tensor,
        bias: paddle.Tensor | None,
        heads: Heads,
    ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        return weight, bias  # fused_qkv_rope takes the checkpoint's layout

    def rope_table(
        self,
        cos: paddle.Tensor,
        sin: paddle.Tensor,
        heads: Heads,
    ) -> paddle.Tensor:
        """cos and sin stacked as the op's rotary_embs, [2, 1, T, 1, D]."""
        return paddle.stack([cos, sin], axis=0).reshape([2, 1, cos.shape[0], 1, heads.head_dim])

    def qkv_rope(
        self,
        x: paddle.Tensor,
        weight: paddle.Tensor,
        bias: paddle.Tensor | None,
        rope: paddle.Tensor,
        heads: Heads,
        qk_norm: Any = None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        if qk_norm is not None:
            raise ValueError(QK_NORM_REFUSAL)
        num_heads, num_kv_heads, head_dim, interleaved = heads
        tokens = x.shape[0]
        # The op derives the KV head count from the weight's width; a mismatch would
        # silently split q, k and v at the wrong columns.
        if weight.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
            raise ValueError(
                f"qkv weight width {weight.shape[1]} != (num_heads {num_heads} + 2 * "
                f"num_kv_heads {num_kv_heads}) * head_dim {head_dim}"
            )
        q, kv = self.plugin.fused_qkv_rope(
            x,
            weight,
            bias,
            rope.astype(x.dtype),
            head_dim,
            num_heads,
            1,  # total_batch: every token of the step as one row; the op only reshapes by it
            transpose=False,  # weight is [hidden, (H + 2 KV) D], as FastDeploy passes it
            use_neox_style=not interleaved,
        )
        kv_shape = [tokens, num_kv_heads, head_dim]
        return (
            q.reshape([tokens, num_heads, head_dim]),
            kv[0].reshape(kv_shape),
            kv[1].reshape(kv_shape),
        )

    def write_blocks(
        self,
        k_cache: Cache,
        v_cache: Cache,
        block_indices: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
    ) -> None:
        shape = [block_indices.shape[0], *k_cache.shape[1:]]
        for cache, values in ((k_cache, k), (v_cache, v)):
            blocks = values.reshape(shape).astype(cache.dtype)
            self.plugin.index_copy_(cache, block_indices, blocks, 0)

    def slot_index(
        self, k_cache: Cache, block_indices: paddle.Tensor, block_offsets: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        return block_indices, block_offsets

    def write_slots(
        self,
        k_cache: Cache,
        v_cache: Cache,
        slots: tuple[paddle.Tensor, paddle.Tensor],
        k: paddle.Tensor,
        v: paddle.Tensor,
    ) -> None:
        # The same (block, offset) scatter fused_block_attention does inside, left to
        # Paddle's index_put, which the plugin implements for intel_hpu in place.
        for cache, values in ((k_cache, k), (v_cache, v)):
            paddle.index_put_(cache, slots, values.astype(cache.dtype))

    def _sdpa(
        self,
        q: paddle.Tensor,
        kv: paddle.Tensor,
        mask: paddle.Tensor | None,
        out_weight: paddle.Tensor,
    ) -> paddle.Tensor:
        """fused_sdpa_proj_t over q [B, S, H, D] and kv [2, B, K, KV, D]: causal without a
        mask, else the mask [B, 1, 1, S, K] -> [B * S, hidden]."""
        batch, seq, _, head_dim = q.shape
        out = self.plugin.fused_sdpa_proj_t(
            q,
            kv,
            mask,
            None,  # valid_seq_len
            out_weight,
            scaling_factor=head_dim**-0.5,
            causal=mask is None,
            softmax_mode=0,
        )
        return out.reshape([batch * seq, -1])

    def prefill_layout(
        self, context_lens: Any, chunk_lens: Any, dtype: str, packed: bool = False
    ) -> None:
        return None  # the fused op attends the padded rectangle, causal or masked

    def prefill(
        self,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        out_weight: paddle.Tensor,
        layout: None = None,
    ) -> paddle.Tensor:
        # No mask: causal alone, since padding is a suffix of each row.
        return self._sdpa(q, paddle.stack([k, v], axis=0), None, out_weight)

    def prefill_with_context(
        self,
        q: paddle.Tensor,
        k_cache: Cache,
        v_cache: Cache,
        block_list: paddle.Tensor,
        mask: paddle.Tensor,
        out_weight: paddle.Tensor,
        layout: None = None,
    ) -> paddle.Tensor:
        batch, _, _, head_dim = q.shape
        _, block_size, num_kv_heads, _ = k_cache.shape
        width = block_list.shape[1] * block_size
        flat = block_list.reshape([-1])
        keys = paddle.index_select(k_cache, flat, axis=0)
        values = paddle.index_select(v_cache, flat, axis=0)
        kv = paddle.stack([keys, values], axis=0).reshape([2, batch, width, num_kv_heads, head_dim])
        # The mask gets a group axis, [B, 1, 1, S, K], for the op's grouped-query path.
        return self._sdpa(q, kv, mask.unsqueeze(1).astype(q.dtype), out_weight)

    def decode_layout(
        self,
        block_bias: paddle.Tensor,
        row_slots: paddle.Tensor,
        row_width: int,
        num_rows: int,
        num_heads: int,
    ) -> paddle.Tensor:
        return block_bias  # the fused op combines blocks by their maxima: no row slots

    def decode(
        self,
        q: paddle.Tensor,
        k_cache: Cache,
        v_cache: Cache,
        block_list: paddle.Tensor,
        block_groups: paddle.Tensor,
        block_mapping: paddle.Tensor,
        block_bias: paddle.Tensor,
        out_weight: paddle.Tensor,
        block_range: tuple[int, int] | None = None,
    ) -> paddle.Tensor:
        """block_bias is decode_layout's layout."""
        rows, _, head_dim = q.shape
        if block_range is not None:
            # A span interleaves the rows' blocks; the fused op is given them row by row,
            # as vllm-gaudi lists them (the padding, grouped with the last row, stays masked).
            order = paddle.argsort(block_groups, stable=True)
            block_list, block_groups, block_mapping, block_bias = (
                paddle.gather(x, order)
                for x in (block_list, block_groups, block_mapping, block_bias)
            )
        # Padding blocks belong to the last row with bias -1e30 and a zero mapping row:
        # their block maximum never wins the row's maximum and their sum is mapped to 0.
        out = self.plugin.fused_flatpa_proj(
            q.unsqueeze(1),  # [R, 1, H, D]
            k_cache,
            v_cache,
            block_groups.astype("int32"),
            block_list.astype("int32"),
            block_mapping.astype(q.dtype),
            block_bias.astype(q.dtype),
            out_weight,
            scaling_factor=head_dim**-0.5,
        )
        return out.reshape([rows, -1])
