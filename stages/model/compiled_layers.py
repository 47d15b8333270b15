"""A forward's decoder layers through the compiled operators (model.weights=int8):
a layer of a decode-only step whole (decode_layer.cc) where the attention stage takes it,
else Paddle's attention ops with each residual add and the norm after it one operator.

At decode a small model's layer is some forty Paddle ops whose launches cost more than
their arithmetic; one operator a layer leaves the weights' bytes as the step's cost
(benchmarks/vs_llamacpp.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import paddle

from stages.model.int8_weight import kernel

if TYPE_CHECKING:
    from stages.interfaces import LayerAttention
    from stages.model.attention.interface import CompiledDecode


def compiled_layers(
    model: Any,
    h: paddle.Tensor,
    attention: LayerAttention,
    state: Any,
    rows: paddle.Tensor,
    whole: list[bool],
) -> paddle.Tensor:
    """The TransformerLM's layers on h, then the final norm of `rows`; whole[i]: whether
    decode_layer.cc can run layer i (int8 projections, a dense MLP)."""
    ops, eps = kernel(), model.rms_eps
    x = None  # the next layer's normed input, where the last layer was not whole
    following = [layer.attn_norm for layer in model.layers[1:]] + [model.final_norm]
    for index, (layer, next_norm) in enumerate(zip(model.layers, following, strict=True)):
        compiled = attention.compiled_decode(index, state)
        if compiled is not None and x is None and whole[index]:
            h = decode_layer(ops, h, layer, compiled, model)
            continue
        if x is None:
            x = ops.rms_norm_rows(h, layer.attn_norm, eps)
        q, k, v = attention.qkv_rope(index, x, state)
        attended = attention.attend(index, q, k, v, state, out_weight=layer.out)
        if layer.out_bias is not None:
            attended = attended + layer.out_bias
        h, x = ops.add_rms_norm_rows(h, attended, layer.mlp_norm, eps)
        h, x = ops.add_rms_norm_rows(h, layer.mlp(x), next_norm, eps)
    if x is None:  # the last layer was whole
        x = ops.rms_norm_rows(h, model.final_norm, eps)
    return paddle.gather(x, rows)  # every row normed: one operator, the gather after


def decode_layer(
    ops: Any, h: paddle.Tensor, layer: Any, compiled: CompiledDecode, model: Any
) -> paddle.Tensor:
    """One layer (LayerWeights, whole) of a decode-only step by decode_layer.cc; the
    caches written in place."""
    mlp, step, spec = layer.mlp, compiled.step, model.spec

    def _bias(b: paddle.Tensor | None) -> paddle.Tensor:
        return model.empty_bias if b is None else b

    out, _, _ = ops.decode_layer(
        h, layer.attn_norm,
        compiled.qkv.rows, compiled.qkv.scales, _bias(compiled.qkv_bias),
        layer.out.rows, layer.out.scales, _bias(layer.out_bias),
        layer.mlp_norm,
        mlp.gate_up.rows, mlp.gate_up.scales, _bias(mlp.gate_up_bias),
        mlp.down.rows, mlp.down.scales, _bias(mlp.down_bias),
        step.cos, step.sin, compiled.k_cache, compiled.v_cache,
        step.slot_blocks, step.slot_offsets, step.block_list, step.block_groups,
        step.row_slots, step.block_bias,
        spec.num_heads, spec.num_kv_heads, step.padding_place, model.rms_eps,
        compiled.qkv.threads,
    )  # fmt: skip
    return out
