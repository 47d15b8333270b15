"""Hugging Face-format checkpoints: a local folder of config.json and *.safetensors.

`load_hf_model` (the `model=hf` option) reads LlamaForCausalLM, Qwen2ForCausalLM,
Ernie4_5_ForCausalLM and Ernie4_5_MoeForCausalLM folders into TransformerLM; `export_hf_llama`
writes the built-in model as a LlamaForCausalLM folder. Only safetensors are read, so
nothing from the folder is executed or unpickled. Weights load shard by shard and tensor by
tensor, each written straight into its place in the model's layout and handed to Paddle
without a copy, so loading needs little more memory than the loaded model.
"""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle.utils import dlpack
from safetensors import safe_open
from safetensors.numpy import save_file

from stages.model import (
    DenseMLP,
    LayerWeights,
    ModelDims,
    ModelWeights,
    MoeMLP,
    TransformerLM,
    check_dtype,
    rope_inv_freq,
)

LLAMA = "LlamaForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
ERNIE = "Ernie4_5_ForCausalLM"
ERNIE_MOE = "Ernie4_5_MoeForCausalLM"
SUPPORTED_ARCHITECTURES = (LLAMA, QWEN2, ERNIE, ERNIE_MOE)

INDEX_FILE = "model.safetensors.index.json"
# Formats that are unpickled (or need their framework's own loader) when read.
UNSAFE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pdparams", "*.pkl")


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    """A JSON object file; a missing or malformed file is a one-line error."""
    if not path.is_file():
        if required:
            raise ValueError(f"{path} is missing")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def model_folder(path: str | Path, key: str = "model.path") -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{key}={path}: no such folder")
    return folder


def _token_ids(value: Any, key: str = "token id") -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        # A string such as "2" would otherwise be dropped, silently disabling the token.
        raise ValueError(f"{key}={value!r} must be a token id (an integer) or a list of them")
    return values


@dataclass(frozen=True)
class SpecialIds:
    bos_id: int | None
    eos_ids: frozenset[int]
    pad_id: int | None


def read_special_ids(folder: Path) -> SpecialIds:
    """BOS, EOS and PAD ids from config.json and generation_config.json (int or list each);
    EOS is the union of both, since generation configs often add end-of-turn ids."""
    config = read_json(folder / "config.json", required=False)
    generation = read_json(folder / "generation_config.json", required=False)

    def ids(source: dict[str, Any], name: str, key: str) -> list[int]:
        return _token_ids(source.get(key), f"{name} {key}")

    gen = "generation_config.json"
    eos = ids(config, "config.json", "eos_token_id") + ids(generation, gen, "eos_token_id")
    bos = ids(generation, gen, "bos_token_id") or ids(config, "config.json", "bos_token_id")
    pad = ids(config, "config.json", "pad_token_id") or ids(generation, gen, "pad_token_id")
    return SpecialIds(bos[0] if bos else None, frozenset(eos), pad[0] if pad else None)


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int
    num_shared: int
    norm_min: float
    layers: frozenset[int]


@dataclass(frozen=True)
class CheckpointSpec:
    """What config.json says about the architecture, checked."""

    architecture: str
    dims: ModelDims
    max_position_embeddings: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rope_interleaved: bool
    tied: bool
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    lm_head_bias: bool
    moe: MoeSpec | None = None


class _Fields:
    """Typed reads of config.json fields, each failing with the field's name and value."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.config.get(key, default)
        if value is None:
            raise ValueError(f"config.json has no {key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"config.json: {key}={value!r} is out of range (an integer >= {minimum})"
            )
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self.config.get(key, default)
        if value is None:
            raise ValueError(f"config.json has no {key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"config.json: {key}={value!r} is out of range (a positive number)")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"config.json: {key}={value!r} is out of range (true or false)")
        return value


def _rope(config: Mapping[str, Any], fields: _Fields) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and rope_scaling, or transformers' newer rope_parameters holding both."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = _Fields(params).number("rope_theta")
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return theta, scaling if scaling.get("rope_type", "default") != "default" else None
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(
            f"config.json: rope_scaling={scaling!r} is out of range (an object or null)"
        )
    return fields.number("rope_theta", 10000.0), scaling or None


def _moe_layers(fields: _Fields, num_layers: int) -> frozenset[int]:
    """Which layers route to experts: every `interval`-th from start to end (inclusive, -1 =
    the last layer); the others keep a dense MLP."""
    start = fields.integer("moe_layer_start_index", 1, minimum=0)
    end = fields.config.get("moe_layer_end_index", -1)
    if end == -1:
        end = num_layers - 1
    end = _Fields({"moe_layer_end_index": end}).integer("moe_layer_end_index", minimum=0)
    interval = fields.integer("moe_layer_interval", 1)
    return frozenset(i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end)


def read_spec(config: Mapping[str, Any]) -> CheckpointSpec:
    """Checks config.json against what the model supports; ValueError names the field."""
    architectures = config.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    if name not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"config.json: architecture {name!r} is not supported: supported are "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    f = _Fields(config)
    hidden = f.integer("hidden_size")
    num_heads = f.integer("num_attention_heads")
    num_kv_heads = f.integer("num_key_value_heads", num_heads)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"config.json: num_attention_heads={num_heads} is not a multiple of "
            f"num_key_value_heads={num_kv_heads}"
        )
    head_dim = f.integer("head_dim", hidden // num_heads if hidden % num_heads == 0 else None)
    if head_dim % 2:
        raise ValueError(f"config.json: head_dim={head_dim} is out of range (rotary needs it even)")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"config.json: hidden_act={config['hidden_act']!r} is not supported (silu)"
        )
    if name == QWEN2 and f.flag("use_sliding_window", False):
        raise ValueError(
            "config.json: use_sliding_window=true is not supported: every layer attends to "
            "the whole context here"
        )
    theta, scaling = _rope(config, f)
    rope_inv_freq(head_dim, theta, scaling)  # an unsupported scaling fails before any loading
    num_layers = f.integer("num_hidden_layers")
    ernie = name in (ERNIE, ERNIE_MOE)
    ernie_bias = ernie and f.flag("use_bias", False)
    llama_attention_bias = name == LLAMA and f.flag("attention_bias", False)
    moe = None
    if name == ERNIE_MOE:
        num_experts = f.integer("moe_num_experts")
        moe = MoeSpec(
            num_experts=num_experts,
            top_k=f.integer("moe_k"),
            intermediate_size=f.integer("moe_intermediate_size"),
            num_shared=f.integer("moe_num_shared_experts", 0, minimum=0),
            norm_min=f.number("moe_norm_min", 1e-12),
            layers=_moe_layers(f, num_layers),
        )
        if moe.top_k > num_experts:
            raise ValueError(
                f"config.json: moe_k={moe.top_k} is out of range (at most "
                f"moe_num_experts={num_experts})"
            )
    return CheckpointSpec(
        architecture=name,
        dims=ModelDims(
            vocab_size=f.integer("vocab_size"),
            hidden_size=hidden,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=f.integer("intermediate_size"),
        ),
        max_position_embeddings=f.integer("max_position_embeddings", 2048),
        rms_eps=f.number("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_interleaved=ernie,  # ERNIE-4.5 rotates pairs (2i, 2i + 1), GLM style
        tied=f.flag("tie_word_embeddings", ernie),  # ERNIE-4.5 ties by default
        qkv_bias=name == QWEN2 or llama_attention_bias or ernie_bias,
        out_bias=llama_attention_bias or ernie_bias,
        mlp_bias=(name == LLAMA and f.flag("mlp_bias", False)) or ernie_bias,
        lm_head_bias=name == ERNIE_MOE and ernie_bias,
        moe=moe,
    )


@dataclass(frozen=True)
class Placement:
    """Where one stored tensor goes: into buffer `dest`, at `cols` of its last axis (all of
    it when None), transposed first when stored as an HF Linear weight [out, in]."""

    dest: str
    shape: tuple[int, ...]
    cols: slice | None = None
    transpose: bool = False


@dataclass
class WeightPlan:
    buffers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    float32_buffers: set[str] = field(default_factory=set)  # kept float32 whatever the dtype

    def vector(self, key: str, dest: str, size: int) -> None:
        self.buffers[dest] = (size,)
        self.placements[key] = Placement(dest, (size,))

    def linears(
        self, dest: str, prefix: str, in_features: int, parts: Iterable[tuple[str, int]], bias: bool
    ) -> None:
        """HF Linear layers [out, in] side by side as one [in, sum(out)] matmul weight."""
        parts = list(parts)
        width = sum(out for _, out in parts)
        self.buffers[dest] = (in_features, width)
        if bias:
            self.buffers[dest + ".bias"] = (width,)
        offset = 0
        for name, out in parts:
            cols = slice(offset, offset + out)
            self.placements[f"{prefix}{name}.weight"] = Placement(
                dest, (out, in_features), cols, transpose=True
            )
            if bias:
                self.placements[f"{prefix}{name}.bias"] = Placement(dest + ".bias", (out,), cols)
            offset += out

    def mlp(self, dest: str, prefix: str, hidden: int, inter: int, bias: bool) -> None:
        self.linears(dest + ".gate", prefix, hidden, [("gate_proj", inter)], bias)
        self.linears(dest + ".up", prefix, hidden, [("up_proj", inter)], bias)
        self.linears(dest + ".down", prefix, inter, [("down_proj", hidden)], bias)


def weight_plan(spec: CheckpointSpec) -> WeightPlan:
    """Every tensor the architecture needs, by its HF name, and where it goes."""
    plan = WeightPlan()
    dims = spec.dims
    h, d, vocab = dims.hidden_size, dims.head_dim, dims.vocab_size
    q_width, kv_width = dims.num_heads * d, dims.num_kv_heads * d
    plan.buffers["embed"] = (vocab, h)
    plan.placements["model.embed_tokens.weight"] = Placement("embed", (vocab, h))
    for i in range(dims.num_layers):
        src, dest = f"model.layers.{i}.", f"layers.{i}."
        plan.vector(src + "input_layernorm.weight", dest + "attn_norm", h)
        plan.vector(src + "post_attention_layernorm.weight", dest + "mlp_norm", h)
        attn = [("q_proj", q_width), ("k_proj", kv_width), ("v_proj", kv_width)]
        plan.linears(dest + "qkv", src + "self_attn.", h, attn, spec.qkv_bias)
        plan.linears(dest + "out", src + "self_attn.", q_width, [("o_proj", h)], spec.out_bias)
        moe = spec.moe
        if moe is None or i not in moe.layers:
            plan.mlp(dest + "mlp", src + "mlp.", h, dims.intermediate_size, spec.mlp_bias)
            continue
        plan.buffers[dest + "router"] = (h, moe.num_experts)
        plan.placements[src + "mlp.gate.weight"] = Placement(
            dest + "router", (moe.num_experts, h), transpose=True
        )
        plan.buffers[dest + "correction"] = (moe.num_experts,)
        plan.placements[src + "mlp.moe_statics.e_score_correction_bias"] = Placement(
            dest + "correction", (1, moe.num_experts)
        )
        plan.float32_buffers |= {dest + "router", dest + "correction"}
        for e in range(moe.num_experts):
            plan.mlp(
                f"{dest}experts.{e}",
                f"{src}mlp.experts.{e}.",
                h,
                moe.intermediate_size,
                spec.mlp_bias,
            )
        if moe.num_shared:
            shared = moe.intermediate_size * moe.num_shared
            plan.mlp(dest + "shared", src + "mlp.shared_experts.", h, shared, spec.mlp_bias)
    plan.vector("model.norm.weight", "final_norm", h)
    if not spec.tied:
        plan.linears("lm_head", "", h, [("lm_head", vocab)], spec.lm_head_bias)
    elif spec.lm_head_bias:
        plan.vector("lm_head.bias", "lm_head.bias", vocab)
    return plan


def weight_files(folder: Path) -> dict[str, Path]:
    """Each stored tensor's shard: from model.safetensors.index.json, else every
    *.safetensors file in the folder."""
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path} has no weight_map")
        files: dict[str, Path] = {}
        for key, name in weight_map.items():
            # A shard is named inside the folder; an index pointing elsewhere is refused.
            if not isinstance(name, str) or Path(name).name != name:
                raise ValueError(
                    f"{index_path}: shard {name!r} of {key} is not a file in the folder"
                )
            path = folder / name
            if not path.is_file():
                raise ValueError(f"{path} is missing (named by {INDEX_FILE} for {key})")
            files[key] = path
        return files
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        unsafe = sorted(p.name for pattern in UNSAFE_WEIGHTS for p in folder.glob(pattern))
        if unsafe:
            raise ValueError(
                f"{folder} has weights only as {', '.join(unsafe[:3])}: these formats are "
                "unpickled when read, which can run code, so only *.safetensors are loaded "
                "(convert them to safetensors first)"
            )
        raise ValueError(f"{folder} has no *.safetensors weights")
    files = {}
    for path in shards:
        with _open(path) as handle:
            for key in handle.keys():
                files.setdefault(key, path)
    return files


def _open(path: Path):
    try:
        return safe_open(str(path), framework="numpy")
    except Exception as err:  # safetensors raises its own error types for a corrupt header
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from err


# How each stored dtype is read; bfloat16, which numpy lacks, as 16-bit words then widened.
_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}
# A tensor is read in blocks of whole rows of at most this size (one row at least), so
# reading never holds a second copy of a large tensor (an embedding, an lm_head).
CHUNK_BYTES = 2 << 20


def _data_offsets(path: Path) -> tuple[int, dict[str, Any]]:
    """Where the data starts and the header (an 8-byte little-endian length, then JSON)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def _row_blocks(
    file, offset: int, kind: str, shape: tuple[int, ...]
) -> Iterator[tuple[int, np.ndarray]]:
    """A stored tensor as float32 blocks of whole rows: (first row, block [rows, ...])."""
    rows, row_shape = (shape[0], shape[1:]) if shape else (1, ())
    row_items = math.prod(row_shape)
    stored = np.dtype(_NUMPY_DTYPES[kind])
    step = max(1, CHUNK_BYTES // max(1, row_items * stored.itemsize))
    for first in range(0, rows, step):
        count = min(step, rows - first) * row_items
        raw = np.empty(count, dtype=stored)
        file.seek(offset + first * row_items * stored.itemsize)
        if file.readinto(memoryview(raw).cast("B")) != raw.nbytes:
            raise ValueError(f"{file.name} ends inside a tensor: the file is truncated")
        if kind == "BF16":  # a bfloat16 is the top half of a float32
            wide = raw.astype(np.uint32)
            wide <<= 16
            block = wide.view(np.float32)
        else:
            block = raw.astype(np.float32, copy=False)
        yield first, block.reshape((-1, *row_shape))


def _place(target: np.ndarray, placement: Placement, first: int, block: np.ndarray) -> None:
    """Writes rows first.. of a stored tensor to where the model keeps them."""
    start = placement.cols.start if placement.cols is not None else 0
    if placement.transpose:  # HF Linear rows are output features: columns of [in, out]
        target[:, start + first : start + first + block.shape[0]] = block.T
        return
    # Untransposed targets are whole buffers or 1-D slices, contiguous: fill them in order.
    flat = target.reshape(-1) if placement.cols is None else target[placement.cols]
    row_items = block.size // block.shape[0]
    flat[first * row_items : first * row_items + block.size] = block.reshape(-1)


def _to_paddle(buffer: np.ndarray, dtype: str) -> paddle.Tensor:
    if dtype == "float32":
        return dlpack.from_dlpack(buffer)  # shares the buffer: no second copy while loading
    return paddle.to_tensor(buffer).astype(dtype)


def load_state(
    files: Mapping[str, Path], plan: WeightPlan, dtype: str, folder: Path
) -> dict[str, paddle.Tensor]:
    """Reads every planned tensor, shard by shard and block by block, into the model's
    layout; each model tensor goes to Paddle as soon as its last part is in."""
    missing = [key for key in plan.placements if key not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"weight {missing[0]} is missing from {folder}{more}")
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for key in plan.placements:
        by_shard[files[key]].append(key)

    # safetensors checks each header; every shape and dtype is checked before any data.
    for path, keys in by_shard.items():
        with _open(path) as handle:
            for key in keys:
                stored = handle.get_slice(key)
                shape, kind = tuple(stored.get_shape()), stored.get_dtype()
                expected = plan.placements[key].shape
                if shape != expected:
                    raise ValueError(
                        f"weight {key} has shape {list(shape)}, expected {list(expected)}"
                    )
                if kind not in _NUMPY_DTYPES:
                    raise ValueError(
                        f"weight {key} is stored as {kind}: supported are "
                        f"{', '.join(_NUMPY_DTYPES)}"
                    )

    pending: dict[str, int] = defaultdict(int)
    for placement in plan.placements.values():
        pending[placement.dest] += 1
    buffers: dict[str, np.ndarray] = {}
    state: dict[str, paddle.Tensor] = {}
    for path, keys in by_shard.items():
        data_start, header = _data_offsets(path)
        with path.open("rb") as file:
            for key in keys:
                placement, entry = plan.placements[key], header[key]
                dest = placement.dest
                if dest not in buffers:
                    buffers[dest] = np.empty(plan.buffers[dest], dtype=np.float32)
                offset = data_start + entry["data_offsets"][0]
                for first, block in _row_blocks(file, offset, entry["dtype"], placement.shape):
                    _place(buffers[dest], placement, first, block)
                pending[dest] -= 1
                if not pending[dest]:
                    keep32 = dest in plan.float32_buffers
                    state[dest] = _to_paddle(buffers.pop(dest), "float32" if keep32 else dtype)
    return state


def _assemble(spec: CheckpointSpec, state: Mapping[str, paddle.Tensor]) -> ModelWeights:
    def mlp(prefix: str) -> DenseMLP:
        return DenseMLP(
            state[prefix + ".gate"],
            state[prefix + ".up"],
            state[prefix + ".down"],
            state.get(prefix + ".gate.bias"),
            state.get(prefix + ".up.bias"),
            state.get(prefix + ".down.bias"),
        )

    layers = []
    for i in range(spec.dims.num_layers):
        p = f"layers.{i}."
        if spec.moe is not None and i in spec.moe.layers:
            block: DenseMLP | MoeMLP = MoeMLP(
                router=state[p + "router"],
                experts=[mlp(f"{p}experts.{e}") for e in range(spec.moe.num_experts)],
                top_k=spec.moe.top_k,
                norm_min=spec.moe.norm_min,
                correction_bias=state[p + "correction"],
                shared=mlp(p + "shared") if spec.moe.num_shared else None,
            )
        else:
            block = mlp(p + "mlp")
        layers.append(
            LayerWeights(
                attn_norm=state[p + "attn_norm"],
                qkv=state[p + "qkv"],
                out=state[p + "out"],
                mlp_norm=state[p + "mlp_norm"],
                mlp=block,
                qkv_bias=state.get(p + "qkv.bias"),
                out_bias=state.get(p + "out.bias"),
            )
        )
    return ModelWeights(
        embed=state["embed"],
        layers=layers,
        final_norm=state["final_norm"],
        lm_head=state.get("lm_head"),
        lm_head_bias=state.get("lm_head.bias"),
    )


def load_hf_model(path: str, dtype: str = "float32", max_position: int = 0) -> TransformerLM:
    """The model of a local Hugging Face folder, in compute dtype `dtype`, with rotary tables
    for `max_position` positions (0 = the config's max_position_embeddings)."""
    folder = model_folder(path)
    spec = read_spec(read_json(folder / "config.json"))
    check_dtype(dtype)
    if max_position > spec.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_position} is above the model's max_position_embeddings="
            f"{spec.max_position_embeddings} (config.json): lower max_model_len"
        )
    special = read_special_ids(folder)
    for name, ids in (
        ("bos", [special.bos_id]),
        ("eos", special.eos_ids),
        ("pad", [special.pad_id]),
    ):
        bad = sorted(i for i in ids if i is not None and not 0 <= i < spec.dims.vocab_size)
        if bad:
            raise ValueError(
                f"{folder}: {name}_token_id {bad[0]} is outside the vocabulary "
                f"(vocab_size={spec.dims.vocab_size} in config.json)"
            )
    plan = weight_plan(spec)
    state = load_state(weight_files(folder), plan, dtype, folder)
    return TransformerLM(
        vocab_size=spec.dims.vocab_size,
        hidden_size=spec.dims.hidden_size,
        num_layers=spec.dims.num_layers,
        num_heads=spec.dims.num_heads,
        num_kv_heads=spec.dims.num_kv_heads,
        intermediate_size=spec.dims.intermediate_size,
        max_position=max_position or spec.max_position_embeddings,
        head_dim=spec.dims.head_dim,
        rope_theta=spec.rope_theta,
        rms_eps=spec.rms_eps,
        dtype=dtype,
        rope_scaling=spec.rope_scaling,
        rope_interleaved=spec.rope_interleaved,
        weights=_assemble(spec, state),
        eos_ids=special.eos_ids,
    )


def export_hf_llama(
    model: TransformerLM,
    folder: str | Path,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> Path:
    """Writes `model` as a LlamaForCausalLM folder (config.json, model.safetensors).

    HF Linear weights are [out, in]; the model keeps [in, out] for its matmuls, so every
    projection is transposed on the way out. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = model.dims
    if model.rope_interleaved or model.has_biases or model.has_moe:
        raise ValueError("export_hf_llama writes dense Llama models (rotate-half RoPE, no biases)")
    q_width, kv_width = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim

    def host(tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.numpy())

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": host(model.embed)}
    for index, layer in enumerate(model.layers):
        prefix = f"model.layers.{index}."
        qkv = host(layer.qkv)
        tensors.update(
            {
                prefix + "input_layernorm.weight": host(layer.attn_norm),
                prefix + "self_attn.q_proj.weight": qkv[:, :q_width].T.copy(),
                prefix + "self_attn.k_proj.weight": qkv[:, q_width : q_width + kv_width].T.copy(),
                prefix + "self_attn.v_proj.weight": qkv[:, q_width + kv_width :].T.copy(),
                prefix + "self_attn.o_proj.weight": host(layer.out).T.copy(),
                prefix + "post_attention_layernorm.weight": host(layer.mlp_norm),
                prefix + "mlp.gate_proj.weight": host(layer.mlp.gate).T.copy(),
                prefix + "mlp.up_proj.weight": host(layer.mlp.up).T.copy(),
                prefix + "mlp.down_proj.weight": host(layer.mlp.down).T.copy(),
            }
        )
    tensors["model.norm.weight"] = host(model.final_norm)
    tied = model.lm_head is None
    if not tied:
        tensors["lm_head.weight"] = host(model.lm_head).T.copy()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": d.vocab_size,
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": model.max_position,
        "rms_norm_eps": model.rms_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": model.rope_scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": model.dtype,
    }
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
