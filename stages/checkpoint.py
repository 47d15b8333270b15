"""Hugging Face-format checkpoints: a local folder of config.json and *.safetensors.

`load_hf_model` (the `model=hf` option) reads Llama, Mistral, Qwen2, Qwen3, ERNIE-4.5 and
ERNIE-4.5 MoE folders into TransformerLM, under the architecture names of Baidu's
remote-code folders and of transformers' own classes, with MoE experts stored per expert
or fused (transformers 5); `export_hf_llama` writes the built-in model as a
LlamaForCausalLM folder. Only safetensors are read, so nothing from the folder is executed
or unpickled. Weights load shard by shard and tensor by tensor, each written straight into
its place in the model's layout and handed to Paddle without a copy, so loading needs
little more memory than the loaded model.
"""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import safe_open

from stages.model_spec import ModelSpec, MoeLayout, dtype_bytes
from stages.rope import rope_inv_freq

if TYPE_CHECKING:  # reading a config.json needs no Paddle; loading weights imports it
    import paddle

    from stages.model import DenseMLP, ModelWeights, MoeMLP, TransformerLM

# Architecture families, named by their first name below.
LLAMA = "LlamaForCausalLM"
MISTRAL = "MistralForCausalLM"  # Llama's layout
QWEN2 = "Qwen2ForCausalLM"
QWEN3 = "Qwen3ForCausalLM"
ERNIE = "Ernie4_5_ForCausalLM"
ERNIE_MOE = "Ernie4_5_MoeForCausalLM"
# Every name real folders give an architecture: Baidu's remote-code classes
# (Ernie4_5_ForCausalLM) and transformers' own (Ernie4_5ForCausalLM), which write the same
# tensors; Ernie4_5MoeForCausalLM is the MoE's name in some Baidu-derived folders.
ARCHITECTURE_FAMILIES = {
    LLAMA: LLAMA,
    MISTRAL: MISTRAL,
    QWEN2: QWEN2,
    QWEN3: QWEN3,
    ERNIE: ERNIE,
    "Ernie4_5ForCausalLM": ERNIE,
    ERNIE_MOE: ERNIE_MOE,
    "Ernie4_5MoeForCausalLM": ERNIE_MOE,
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_FAMILIES)

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


def read_folder_spec(path: str | Path) -> CheckpointSpec:
    """The checked config.json of a model folder whose weight files can be read without
    blocking (a FIFO or a device named *.safetensors would block or never end)."""
    folder = model_folder(path)
    for weights in sorted(folder.glob("*.safetensors")):
        if not weights.is_file():
            raise ValueError(f"{weights} is not a regular file: model.path must hold real files")
    return read_spec(read_json(folder / "config.json"))


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
class CheckpointSpec:
    """What config.json says, checked: the model's description, and how it computes."""

    architecture: str  # as config.json names it
    family: str  # the architecture family of ARCHITECTURE_FAMILIES
    model: ModelSpec
    max_position_embeddings: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rope_interleaved: bool
    sliding_window: int | None = None  # each token attends to at most this many (Mistral)


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
        if not math.isfinite(value):  # JSON's Infinity parses
            raise ValueError(f"config.json: {key}={value!r} is not a finite number")
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


def _moe(f: _Fields, num_layers: int) -> MoeLayout:
    num_experts, top_k = f.integer("moe_num_experts"), f.integer("moe_k")
    if top_k > num_experts:
        raise ValueError(
            f"config.json: moe_k={top_k} is out of range (at most moe_num_experts={num_experts})"
        )
    return MoeLayout(
        num_experts=num_experts,
        experts_per_token=top_k,
        expert_intermediate_size=f.integer("moe_intermediate_size"),
        num_shared_experts=f.integer("moe_num_shared_experts", 0, minimum=0),
        layers=_moe_layers(f, num_layers),
        norm_min=f.number("moe_norm_min", 1e-12),
    )


def _architecture(config: Mapping[str, Any]) -> tuple[str, str]:
    """(the name config.json gives, its family), or the one line listing the supported."""
    architectures = config.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    if name not in ARCHITECTURE_FAMILIES:
        raise ValueError(
            f"config.json: architecture {name!r} is not supported: supported are "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return name, ARCHITECTURE_FAMILIES[name]


def _dims(f: _Fields) -> dict[str, int]:
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
    return dict(
        vocab_size=f.integer("vocab_size"),
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=f.integer("intermediate_size"),
    )


def _sliding_window(family: str, f: _Fields) -> int | None:
    """Mistral's window (null = none); Qwen's sliding layers are refused outright."""
    if family in (QWEN2, QWEN3) and f.flag("use_sliding_window", False):
        raise ValueError(
            "config.json: use_sliding_window=true is not supported: every layer attends to "
            "the whole context here"
        )
    if family != MISTRAL or f.config.get("sliding_window") is None:
        return None
    return f.integer("sliding_window")


def read_spec(config: Mapping[str, Any]) -> CheckpointSpec:
    """Checks config.json against what the model supports; ValueError names the field."""
    name, family = _architecture(config)
    f = _Fields(config)
    dims = _dims(f)
    num_layers = dims["num_layers"]
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"config.json: hidden_act={config['hidden_act']!r} is not supported (silu)"
        )
    sliding_window = _sliding_window(family, f)
    theta, scaling = _rope(config, f)
    rope_inv_freq(dims["head_dim"], theta, scaling)  # an unsupported scaling fails before loading
    ernie = family in (ERNIE, ERNIE_MOE)
    ernie_bias = ernie and f.flag("use_bias", False)
    llama_like = family in (LLAMA, MISTRAL, QWEN3)  # attention_bias: q, k, v and o biases
    attention_bias = llama_like and f.flag("attention_bias", False)
    model = ModelSpec(
        **dims,
        name=family,
        tied_embeddings=f.flag("tie_word_embeddings", ernie),  # ERNIE-4.5 ties by default
        qkv_bias=family == QWEN2 or attention_bias or ernie_bias,
        out_bias=attention_bias or ernie_bias,
        mlp_bias=(family in (LLAMA, MISTRAL) and f.flag("mlp_bias", False)) or ernie_bias,
        lm_head_bias=family == ERNIE_MOE and ernie_bias,
        qk_norm=family == QWEN3,
        moe=_moe(f, num_layers) if family == ERNIE_MOE else None,
    )
    return CheckpointSpec(
        architecture=name,
        family=family,
        model=model,
        max_position_embeddings=f.integer("max_position_embeddings", 2048),
        rms_eps=f.number("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_interleaved=ernie,  # ERNIE-4.5 rotates pairs (2i, 2i + 1), GLM style
        sliding_window=sliding_window,
    )


def check_context(spec: CheckpointSpec, context: int) -> None:
    """Refuses serving `context` tokens (max_model_len) where the model cannot attend to them
    all: past its position table, or past a sliding window, which this engine does not
    apply (every layer attends to the whole context)."""
    if context > spec.max_position_embeddings:
        raise ValueError(
            f"max_model_len={context} is above the model's max_position_embeddings="
            f"{spec.max_position_embeddings} (config.json): lower max_model_len"
        )
    window = spec.sliding_window
    if window is not None and window < context:
        raise ValueError(
            f"config.json: sliding_window={window} is smaller than the context of {context} "
            f"tokens, and every layer attends to the whole context here: lower max_model_len "
            f"to at most {window}"
        )


@dataclass(frozen=True)
class Placement:
    """Where (part of) one stored tensor goes: rows `rows` of it, seen as [-1, last axis]
    (all of it when None), into buffer `dest` at `cols` of its last axis (all of it when
    None), transposed first when stored as an HF Linear weight [out, in]. A fused tensor
    (all experts' gate_up_proj) has one placement per part."""

    dest: str
    rows: slice | None = None
    cols: slice | None = None
    transpose: bool = False


@dataclass
class WeightPlan:
    buffers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # stored, by HF name
    placements: dict[str, list[Placement]] = field(default_factory=dict)
    float32_buffers: set[str] = field(default_factory=set)  # kept float32 whatever the dtype

    def place(self, key: str, shape: tuple[int, ...], placement: Placement) -> None:
        self.shapes[key] = shape
        self.placements.setdefault(key, []).append(placement)

    def parts_per_buffer(self) -> dict[str, int]:
        """How many stored tensors fill each model tensor: a loader hands a buffer to the
        model once that many have been placed."""
        pending: dict[str, int] = defaultdict(int)
        for placements in self.placements.values():
            for placement in placements:
                pending[placement.dest] += 1
        return pending

    def vector(self, key: str, dest: str, size: int, stored: tuple[int, ...] = ()) -> None:
        self.buffers[dest] = (size,)
        self.place(key, stored or (size,), Placement(dest))

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
            key = f"{prefix}{name}.weight"
            self.place(key, (out, in_features), Placement(dest, cols=cols, transpose=True))
            if bias:
                self.place(f"{prefix}{name}.bias", (out,), Placement(dest + ".bias", cols=cols))
            offset += out

    def mlp(self, dest: str, prefix: str, hidden: int, inter: int, bias: bool) -> None:
        self.linears(dest + ".gate", prefix, hidden, [("gate_proj", inter)], bias)
        self.linears(dest + ".up", prefix, hidden, [("up_proj", inter)], bias)
        self.linears(dest + ".down", prefix, inter, [("down_proj", hidden)], bias)

    def fused_experts(self, dest: str, prefix: str, experts: int, hidden: int, inter: int) -> None:
        """transformers 5's fused experts (its Experts modules and conversion mapping):
        gate_up_proj [experts, 2 * inter, hidden], each expert's gate rows then its up rows,
        and down_proj [experts, hidden, inter]; every expert's slice is an HF Linear
        [out, in], unbiased."""
        gate_up, down = prefix + "gate_up_proj", prefix + "down_proj"
        for e in range(experts):
            to = f"{dest}.{e}"
            self.buffers |= {to + ".gate": (hidden, inter), to + ".up": (hidden, inter)}
            self.buffers[to + ".down"] = (inter, hidden)
            first = 2 * e * inter
            parts = {
                "gate": slice(first, first + inter),
                "up": slice(first + inter, first + 2 * inter),
            }
            for name, rows in parts.items():
                placement = Placement(f"{to}.{name}", rows=rows, transpose=True)
                self.place(gate_up, (experts, 2 * inter, hidden), placement)
            rows = slice(e * hidden, (e + 1) * hidden)
            placement = Placement(to + ".down", rows=rows, transpose=True)
            self.place(down, (experts, hidden, inter), placement)


# Where transformers 5 and the remote code keep the MoE router's correction bias.
CORRECTION_BIAS_KEYS = (
    "mlp.moe_statics.e_score_correction_bias",
    "mlp.gate.moe_statics.e_score_correction_bias",
)


def _moe_plan(
    plan: WeightPlan, spec: CheckpointSpec, src: str, dest: str, stored: Collection[str]
) -> None:
    """One MoE layer's router, experts (per expert or fused, as stored) and shared experts."""
    model = spec.model
    moe, h = model.moe, model.hidden_size
    assert moe is not None
    plan.buffers[dest + "router"] = (h, moe.num_experts)
    plan.place(
        src + "mlp.gate.weight", (moe.num_experts, h), Placement(dest + "router", transpose=True)
    )
    bias_key = next((k for k in CORRECTION_BIAS_KEYS if src + k in stored), CORRECTION_BIAS_KEYS[0])
    plan.vector(src + bias_key, dest + "correction", moe.num_experts, (1, moe.num_experts))
    plan.float32_buffers |= {dest + "router", dest + "correction"}
    experts, inter = src + "mlp.experts.", moe.expert_intermediate_size
    if experts + "gate_up_proj" in stored:
        plan.fused_experts(dest + "experts", experts, moe.num_experts, h, inter)
    else:
        for e in range(moe.num_experts):
            plan.mlp(f"{dest}experts.{e}", f"{experts}{e}.", h, inter, model.mlp_bias)
    if moe.num_shared_experts:
        shared = inter * moe.num_shared_experts
        plan.mlp(dest + "shared", src + "mlp.shared_experts.", h, shared, model.mlp_bias)


def weight_plan(spec: CheckpointSpec, stored: Collection[str] = ()) -> WeightPlan:
    """Every tensor the architecture needs, by its HF name, and where it goes. `stored`, the
    folder's tensor names, picks between namings (fused or per-expert MoE experts); without
    it, the per-expert naming of Baidu's folders."""
    plan = WeightPlan()
    dims = spec.model
    h, d, vocab = dims.hidden_size, dims.head_dim, dims.vocab_size
    q_width, kv_width = dims.num_heads * d, dims.num_kv_heads * d
    plan.buffers["embed"] = (vocab, h)
    plan.place("model.embed_tokens.weight", (vocab, h), Placement("embed"))
    for i in range(dims.num_layers):
        src, dest = f"model.layers.{i}.", f"layers.{i}."
        plan.vector(src + "input_layernorm.weight", dest + "attn_norm", h)
        plan.vector(src + "post_attention_layernorm.weight", dest + "mlp_norm", h)
        attn = [("q_proj", q_width), ("k_proj", kv_width), ("v_proj", kv_width)]
        plan.linears(dest + "qkv", src + "self_attn.", h, attn, dims.qkv_bias)
        plan.linears(dest + "out", src + "self_attn.", q_width, [("o_proj", h)], dims.out_bias)
        if dims.qk_norm:
            plan.vector(src + "self_attn.q_norm.weight", dest + "q_norm", d)
            plan.vector(src + "self_attn.k_norm.weight", dest + "k_norm", d)
        if dims.is_moe_layer(i):
            _moe_plan(plan, spec, src, dest, stored)
        else:
            plan.mlp(dest + "mlp", src + "mlp.", h, dims.intermediate_size, dims.mlp_bias)
    plan.vector("model.norm.weight", "final_norm", h)
    if not dims.tied_embeddings:
        plan.linears("lm_head", "", h, [("lm_head", vocab)], dims.lm_head_bias)
    elif dims.lm_head_bias:
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
    for path in shards:  # a FIFO or a device would block the header's read for ever
        if not path.is_file():
            raise ValueError(f"{path} is not a regular file: a model folder must hold real files")
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


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """Where the data starts and the header (an 8-byte little-endian length, then JSON)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as err:  # JSON and UTF-8 errors included
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from err
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a readable safetensors file: its header is no object")
    return 8 + length, header


def _as_rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A stored shape as rows of its last axis, [-1, last], the view placements' rows
    index; a vector stays one (its rows are single values)."""
    return shape if len(shape) <= 2 else (math.prod(shape[:-1]), shape[-1])


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
        if file.readinto(raw.data.cast("B")) != raw.nbytes:
            raise ValueError(f"{file.name} ends inside a tensor: the file is truncated")
        if kind == "BF16":  # a bfloat16 is the top half of a float32
            wide = raw.astype(np.uint32)
            wide <<= 16
            block = wide.view(np.float32)
        else:
            block = raw.astype(np.float32, copy=False)
        yield first, block.reshape((-1, *row_shape))


def _place(target: np.ndarray, placement: Placement, first: int, block: np.ndarray) -> None:
    """Writes rows first.. of a stored tensor to where the model keeps them: the rows of the
    placement's part, if it has one, counted from the part's first."""
    if placement.rows is not None:
        lo, hi = max(first, placement.rows.start), min(first + len(block), placement.rows.stop)
        if lo >= hi:
            return
        block, first = block[lo - first : hi - first], lo - placement.rows.start
    start = placement.cols.start if placement.cols is not None else 0
    if placement.transpose:  # HF Linear rows are output features: columns of [in, out]
        target[:, start + first : start + first + block.shape[0]] = block.T
        return
    # Untransposed targets are whole buffers or 1-D slices, contiguous: fill them in order.
    flat = target.reshape(-1) if placement.cols is None else target[placement.cols]
    row_items = block.size // block.shape[0]
    flat[first * row_items : first * row_items + block.size] = block.reshape(-1)


def _to_paddle(buffer: np.ndarray, dtype: str) -> paddle.Tensor:
    import paddle
    from paddle.utils import dlpack

    if dtype == "float32":
        return dlpack.from_dlpack(buffer)  # shares the buffer: no second copy while loading
    return paddle.to_tensor(buffer).astype(dtype)


def check_headers(
    files: Mapping[str, Path], plan: WeightPlan, folder: Path
) -> dict[Path, list[str]]:
    """Every planned tensor is stored, with its shape and a readable dtype, from the
    safetensors headers alone; returns the planned names by shard."""
    missing = [key for key in plan.shapes if key not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"weight {missing[0]} is missing from {folder}{more}")
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for key in plan.shapes:
        by_shard[files[key]].append(key)
    for path, keys in by_shard.items():
        with _open(path) as handle:  # safetensors checks each header as it opens it
            for key in keys:
                stored = handle.get_slice(key)
                shape, kind = tuple(stored.get_shape()), stored.get_dtype()
                if shape != plan.shapes[key]:
                    raise ValueError(
                        f"weight {key} has shape {list(shape)}, expected {list(plan.shapes[key])}"
                    )
                if kind not in _NUMPY_DTYPES:
                    raise ValueError(
                        f"weight {key} is stored as {kind}: supported are "
                        f"{', '.join(_NUMPY_DTYPES)}"
                    )
    return by_shard


def load_state(
    files: Mapping[str, Path], plan: WeightPlan, dtype: str, folder: Path
) -> dict[str, paddle.Tensor]:
    """Reads every planned tensor, shard by shard and block by block, into the model's
    layout; each model tensor goes to Paddle as soon as its last part is in."""
    by_shard = check_headers(files, plan, folder)  # every shape and dtype before any data
    pending = plan.parts_per_buffer()
    buffers: dict[str, np.ndarray] = {}
    state: dict[str, paddle.Tensor] = {}
    for path, keys in by_shard.items():
        data_start, header = read_header(path)
        with path.open("rb") as file:
            for key in keys:
                placements, entry = plan.placements[key], header[key]
                for dest in {p.dest for p in placements} - buffers.keys():
                    buffers[dest] = np.empty(plan.buffers[dest], dtype=np.float32)
                offset = data_start + entry["data_offsets"][0]
                rows = _as_rows(plan.shapes[key])
                for first, block in _row_blocks(file, offset, entry["dtype"], rows):
                    for placement in placements:
                        _place(buffers[placement.dest], placement, first, block)
                for dest in (p.dest for p in placements):
                    pending[dest] -= 1
                    if not pending[dest]:
                        keep32 = dest in plan.float32_buffers
                        state[dest] = _to_paddle(buffers.pop(dest), "float32" if keep32 else dtype)
    return state


def _assemble(spec: CheckpointSpec, state: Mapping[str, paddle.Tensor]) -> ModelWeights:
    from stages.model import DenseMLP, LayerWeights, ModelWeights, MoeMLP

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
    moe = spec.model.moe
    for i in range(spec.model.num_layers):
        p = f"layers.{i}."
        if moe is not None and i in moe.layers:
            block: DenseMLP | MoeMLP = MoeMLP(
                router=state[p + "router"],
                experts=[mlp(f"{p}experts.{e}") for e in range(moe.num_experts)],
                top_k=moe.experts_per_token,
                norm_min=moe.norm_min,
                correction_bias=state[p + "correction"],
                shared=mlp(p + "shared") if moe.num_shared_experts else None,
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
                q_norm=state.get(p + "q_norm"),
                k_norm=state.get(p + "k_norm"),
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
    from stages.model import TransformerLM, check_dtype

    folder = model_folder(path)
    spec = read_spec(read_json(folder / "config.json"))
    check_dtype(dtype)
    check_context(spec, max_position or spec.max_position_embeddings)
    special = read_special_ids(folder)
    for name, ids in (
        ("bos", [special.bos_id]),
        ("eos", special.eos_ids),
        ("pad", [special.pad_id]),
    ):
        vocab = spec.model.vocab_size
        bad = sorted(i for i in ids if i is not None and not 0 <= i < vocab)
        if bad:
            raise ValueError(
                f"{folder}: {name}_token_id {bad[0]} is outside the vocabulary "
                f"(vocab_size={vocab} in config.json)"
            )
    files = weight_files(folder)
    state = load_state(files, weight_plan(spec, files.keys()), dtype, folder)
    return TransformerLM(
        replace(spec.model, dtype_bytes=dtype_bytes(dtype)),
        max_position=max_position or spec.max_position_embeddings,
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
    Returns the folder."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = model.spec
    biased = spec.qkv_bias or spec.out_bias or spec.mlp_bias or spec.lm_head_bias
    if model.rope_interleaved or biased or spec.moe is not None or spec.qk_norm:
        raise ValueError("export_hf_llama writes dense Llama models (rotate-half RoPE, no biases)")
    save_file(_llama_tensors(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = _llama_config(model)
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def _llama_tensors(model: TransformerLM) -> dict[str, np.ndarray]:
    """The weights under Hugging Face's Llama names. HF Linear weights are [out, in]; the
    model keeps [in, out] for its matmuls, so every projection is transposed."""
    from stages.model import DenseMLP

    d = model.spec
    q_width, kv_width = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim

    def host(tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.numpy())

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": host(model.embed)}
    for index, layer in enumerate(model.layers):
        prefix = f"model.layers.{index}."
        qkv, mlp = host(layer.qkv), layer.mlp
        assert isinstance(mlp, DenseMLP)  # export_hf_llama refuses MoE models
        tensors.update(
            {
                prefix + "input_layernorm.weight": host(layer.attn_norm),
                prefix + "self_attn.q_proj.weight": qkv[:, :q_width].T.copy(),
                prefix + "self_attn.k_proj.weight": qkv[:, q_width : q_width + kv_width].T.copy(),
                prefix + "self_attn.v_proj.weight": qkv[:, q_width + kv_width :].T.copy(),
                prefix + "self_attn.o_proj.weight": host(layer.out).T.copy(),
                prefix + "post_attention_layernorm.weight": host(layer.mlp_norm),
                prefix + "mlp.gate_proj.weight": host(mlp.gate).T.copy(),
                prefix + "mlp.up_proj.weight": host(mlp.up).T.copy(),
                prefix + "mlp.down_proj.weight": host(mlp.down).T.copy(),
            }
        )
    tensors["model.norm.weight"] = host(model.final_norm)
    if model.lm_head is not None:
        tensors["lm_head.weight"] = host(model.lm_head).T.copy()
    return tensors


def _llama_config(model: TransformerLM) -> dict[str, Any]:
    d = model.spec
    return {
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
        "tie_word_embeddings": model.lm_head is None,
        "torch_dtype": model.dtype,
    }
