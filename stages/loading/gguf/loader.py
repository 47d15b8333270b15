"""`model=gguf`: a TransformerLM from a GGUF file, its tensors dequantised one at a time.

The metadata becomes the checkpoint loader's architecture spec (stages/loading/gguf/config.py), each
GGUF tensor is renamed to its Hugging Face name, and the checkpoint loader's weight plan
says where it goes; so both formats fill the same model the same way. A tensor is read and
dequantised in blocks of whole rows straight into the model's buffer, so loading holds the
dequantised model plus one block (and one whole query or key weight, for llama's row order).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from stages.loading.checkpoint.assembly import assemble_model
from stages.loading.checkpoint.config import CheckpointSpec
from stages.loading.checkpoint.reading import place_block, to_paddle
from stages.loading.checkpoint.weight_plan import WeightPlan, weight_plan
from stages.loading.gguf.config import check_gguf_context, gguf_spec, token_ids
from stages.loading.gguf.quants import SUPPORTED_TYPES, dequantize
from stages.loading.gguf.reader import GgufHeader, TensorInfo, read_gguf_header
from stages.model.spec import WeightStorage

if TYPE_CHECKING:  # checking a file's tensors needs no Paddle; loading them imports it
    from stages.model.transformer import TransformerLM

# GGUF tensor names (llama.cpp's tensor_mapping) -> Hugging Face names.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
# Dequantised blocks of whole rows of at most this many bytes (one row at least).
CHUNK_BYTES = 4 << 20


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name, or None for one this engine has no use for."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER.fullmatch(name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of a llama query or key weight's rows.

    Its converter (convert_hf_to_gguf.py, LlamaModel.permute) interleaves each head's two
    rotary halves, rows (i, i + head_dim / 2) -> (2i, 2i + 1), because ggml rotates adjacent
    pairs; the engine rotates halves as Hugging Face does, so the rows go back."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def check_tensors(header: GgufHeader, plan: WeightPlan) -> dict[str, TensorInfo]:
    """Every planned tensor's GGUF entry, with its shape and type checked; a stored tensor the
    model has no place for is refused rather than dropped."""
    found: dict[str, TensorInfo] = {}
    for name, info in header.tensors.items():
        key = hf_name(name)
        if key is None or key not in plan.shapes:
            raise ValueError(f"{header.path}: tensor {name!r} has no place in this model")
        found[key] = info
    for key, shape in plan.shapes.items():
        info = found.get(key)
        gguf_name = next((n for n in header.tensors if hf_name(n) == key), key)
        if info is None:
            raise ValueError(f"{header.path}: tensor for {key} is missing")
        if info.shape != shape:
            raise ValueError(
                f"{header.path}: tensor {gguf_name!r} has shape {list(info.shape)}, the "
                f"metadata gives {list(shape)}"
            )
        if info.kind not in SUPPORTED_TYPES:
            names = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise ValueError(
                f"{header.path}: tensor {gguf_name!r} is {info.type_name}, which is not "
                f"supported: supported are {names}"
            )
    return found


def row_blocks(file, info: TensorInfo, whole: bool = False) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 rows [n, last axis]) of a stored tensor, read and dequantised a
    block of rows at a time (all of it at once when `whole`)."""
    kind = GGMLQuantizationType(info.kind)
    block, block_bytes = GGML_QUANT_SIZES[kind]
    width = info.shape[-1]
    rows = info.num_elements // width
    row_bytes = width // block * block_bytes
    step = rows if whole else max(1, CHUNK_BYTES // (4 * width))
    for first in range(0, rows, step):
        count = min(step, rows - first)
        raw = np.empty(count * row_bytes, dtype=np.uint8)
        file.seek(info.offset + first * row_bytes)
        if file.readinto(raw.data) != raw.nbytes:
            raise ValueError(f"{file.name} ends inside tensor {info.name!r}: it is truncated")
        yield first, dequantize(raw, kind).reshape(count, width)


def _permuted_heads(spec: CheckpointSpec, key: str) -> int:
    """How many heads a llama query / key weight's rows are reordered in; 0 = not reordered."""
    if spec.family != "LlamaForCausalLM":
        return 0
    if key.endswith("self_attn.q_proj.weight"):
        return spec.model.num_heads
    if key.endswith("self_attn.k_proj.weight"):
        return spec.model.num_kv_heads
    return 0


def int8_buffers(spec: CheckpointSpec) -> frozenset[str]:
    """The model tensors model.weights=int8 keeps as int8 (TransformerLM.store_int8's):
    every layer's QKV, output, MLP gate_up and down, and the lm head, the embedding where
    tied."""
    plan = weight_plan(spec)
    ends = (".qkv", ".out", ".gate_up", ".down")
    projections = {dest for dest in plan.buffers if dest.endswith(ends)}
    return frozenset(projections | {"lm_head" if "lm_head" in plan.buffers else "embed"})


def load_state(
    header: GgufHeader, spec: CheckpointSpec, dtype: str, int8: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Every model tensor, in the model's layout, each handed to Paddle once complete; those
    named in `int8` rounded to int8 (Int8Weight) as they complete, so that no float32 copy
    of the whole model is ever held beside them."""
    from stages.model.int8_weight import Int8Weight

    plan = weight_plan(spec)
    tensors = check_tensors(header, plan)  # every name, shape and type before any data
    pending = plan.parts_per_buffer()
    buffers: dict[str, np.ndarray] = {}
    state: dict[str, Any] = {}
    with header.path.open("rb") as file:
        for key in plan.shapes:
            placements = plan.placements[key]
            for dest in {p.dest for p in placements} - buffers.keys():
                buffers[dest] = np.empty(plan.buffers[dest], dtype=np.float32)
            heads = _permuted_heads(spec, key)
            for first, block in row_blocks(file, tensors[key], whole=bool(heads)):
                if heads:
                    block = unpermute_rows(block, heads)
                if len(plan.shapes[key]) == 1:  # a vector is one row; placements see values
                    block = block.reshape(-1)
                for placement in placements:
                    place_block(buffers[placement.dest], placement, first, block)
            for dest in (p.dest for p in placements):
                pending[dest] -= 1
                if not pending[dest] and dest in int8:  # the embedding is one row a token
                    store = Int8Weight.of_rows if dest == "embed" else Int8Weight.of_matrix
                    state[dest] = store(buffers.pop(dest))
                elif not pending[dest]:
                    state[dest] = to_paddle(buffers.pop(dest), dtype)
    return state


def load_gguf_model(path: str, dtype: str, max_position: int, weights: str) -> TransformerLM:
    """The model of a GGUF file, in compute dtype `dtype`, with rotary tables for
    `max_position` positions (0 = the file's context length); weights=int8 keeps its
    projections and lm head as int8 (TransformerLM.store_int8)."""
    from stages.model.transformer import check_dtype

    header = read_gguf_header(path)
    spec = gguf_spec(header)
    check_dtype(dtype)
    context = max_position or spec.max_position_embeddings
    check_gguf_context(header, spec, context)
    eos = token_ids(header, "eos", "eot", "eom")
    int8 = int8_buffers(spec) if weights == WeightStorage.int8 else frozenset()
    state = load_state(header, spec, dtype, int8)
    vocab = spec.model.vocab_size
    model = assemble_model(spec, state, dtype, context, [i for i in eos if 0 <= i < vocab])
    if weights == WeightStorage.int8:
        model.store_int8()
    return model
