"""`python -m pipeline.inspect MODEL_DIR`: what a Hugging Face folder holds, and whether
this engine can serve it, from config.json and the safetensors headers alone (or a GGUF
file: `python -m pipeline.inspect FILE.gguf`, from its header).

Nothing is built and no weight is read: the figures come from the config and the tensor
shapes in each shard's header. `--json` prints one JSON document. Exit code 0 when the
engine can serve the folder, 1 when it cannot (the report says why, in one line), 2 for a
folder that is not a model (no folder, or no readable config.json).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.inspect.gguf import describe_gguf, render_gguf
from stages.loading.checkpoint import (
    INDEX_FILE,
    CheckpointSpec,
    check_context,
    check_headers,
    model_folder,
    read_header,
    read_json,
    read_spec,
    read_special_ids,
    weight_files,
    weight_plan,
)
from stages.loading.gguf.reader import is_gguf
from stages.model.rope import rope_type

SERVABLE, NOT_SERVABLE, NOT_A_MODEL = 0, 1, 2


class NotAModel(ValueError):
    """The folder has no model to describe."""


def stored_tensors(files: Mapping[str, Path]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each stored tensor's dtype and shape, from its shard's header."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted(set(files.values())):
        _, header = read_header(path)
        for name, entry in header.items():
            if name != "__metadata__" and files.get(name) == path:
                tensors[name] = (entry["dtype"], tuple(entry["shape"]))
    return tensors


def _token_names(folder: Path) -> dict[int, str]:
    """Special tokens' text by id, from tokenizer.json's added tokens (when it is there)."""
    try:
        added = read_json(folder / "tokenizer.json", required=False).get("added_tokens", [])
    except ValueError:
        return {}
    return {t["id"]: t["content"] for t in added if isinstance(t, dict) and "id" in t}


def _specials(folder: Path) -> dict[str, Any]:
    ids, names = read_special_ids(folder), _token_names(folder)

    def named(token: int | None) -> dict[str, Any] | None:
        return None if token is None else {"id": token, "token": names.get(token)}

    return {
        "tokenizer_json": (folder / "tokenizer.json").is_file(),
        "bos": named(ids.bos_id),
        "eos": [named(t) for t in sorted(ids.eos_ids)],
        "pad": named(ids.pad_id),
    }


def _moe(spec: CheckpointSpec, tensors: Mapping[str, Any], total: int) -> dict[str, Any] | None:
    """The MoE figures; a token runs top_k of each MoE layer's experts, so the others'
    weights are idle for it: `active_parameters` is the total less those."""
    model = spec.model
    moe = model.moe
    if moe is None:
        return None
    fused = any(name.endswith("mlp.experts.gate_up_proj") for name in tensors)
    return {
        "experts": moe.num_experts,
        "top_k": moe.experts_per_token,
        "shared_experts": moe.num_shared_experts,
        "intermediate_size": moe.expert_intermediate_size,
        "moe_layers": sorted(moe.layers),
        "experts_stored": "fused" if fused else "per expert",
        "active_parameters": total - (model.num_parameters() - model.active_parameters()),
    }


def _figures(config: Mapping[str, Any], spec: CheckpointSpec | None) -> dict[str, Any]:
    """Shape figures: from the checked spec, or read as given when the spec is refused."""
    if spec is None:
        keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")
        heads = config.get("num_attention_heads")
        return {
            **{k: config.get(k) for k in keys},
            "num_attention_heads": heads,
            "num_key_value_heads": config.get("num_key_value_heads", heads),
            "head_dim": config.get("head_dim"),
            "max_position_embeddings": config.get("max_position_embeddings"),
        }
    d = spec.model
    return {
        "num_hidden_layers": d.num_layers,
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "vocab_size": d.vocab_size,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": d.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "sliding_window": spec.sliding_window,
        "rope_theta": spec.rope_theta,
        "rope_scaling": rope_type(spec.rope_scaling),
        "tied_embeddings": d.tied_embeddings,
        "qkv_bias": d.qkv_bias,
        "qk_norm": d.qk_norm,
    }


def _servable(folder: Path, config: Mapping[str, Any], context: int) -> tuple[Any, ...]:
    """(spec or None, stored tensors, None or the one line saying why it cannot be served),
    each check as load_hf_model makes it, without reading a weight."""
    spec, tensors = None, {}
    try:
        spec = read_spec(config)
        check_context(spec, context or spec.max_position_embeddings)
        files = weight_files(folder)
        tensors = stored_tensors(files)
        check_headers(files, weight_plan(spec, files.keys()), folder)
        read_json(folder / "tokenizer.json", required=False)  # the tokenizer it would serve with
    except ValueError as err:
        if not tensors:  # still count what is stored, where the headers can be read
            try:
                tensors = stored_tensors(weight_files(folder))
            except ValueError:
                tensors = {}
        return spec, tensors, str(err)
    return spec, tensors, None


def _has_weights(folder: Path) -> bool:
    return (folder / INDEX_FILE).is_file() or any(folder.glob("*.safetensors"))


def tokenizer_options(folder: Path) -> list[str]:
    """The `tokenizer=` options the folder can be served with: hf reads its
    tokenizer.json; byte needs nothing (its ids are not the model's vocabulary)."""
    return ["hf", "byte"] if (folder / "tokenizer.json").is_file() else ["byte"]


def describe(path: str | Path, max_model_len: int = 0) -> dict[str, Any]:
    """The report of a model folder; NotAModel when it holds none. `max_model_len` (0 = the
    model's max_position_embeddings) is the context it would be served with."""
    try:
        folder = model_folder(path, key="MODEL_DIR")
        config = read_json(folder / "config.json")
    except ValueError as err:
        raise NotAModel(str(err)) from err
    spec, tensors, reason = _servable(folder, config, max_model_len)
    architectures = config.get("architectures")
    dtypes = Counter(kind for kind, _ in tensors.values())
    parameters = sum(math.prod(shape) for _, shape in tensors.values())
    counted_from = "weights"
    if spec is not None and not _has_weights(folder):
        # the one model description's count, as model=spec model.config=PATH counts it
        parameters, counted_from = spec.model.num_parameters(), "config"
        reason = (
            "no weights: servable only with executor=simulated "
            f"(model=spec model.config={folder / 'config.json'})"
        )
    return {
        "folder": str(folder),
        "architecture": architectures[0] if isinstance(architectures, list) else None,
        "family": spec.family if spec else None,
        "servable": reason is None,
        "reason": reason,
        "parameters": parameters,
        "parameters_from": counted_from,
        "tokenizers": tokenizer_options(folder),
        "tensors": len(tensors),
        "stored_dtypes": dict(sorted(dtypes.items())),
        "config_dtype": config.get("dtype", config.get("torch_dtype")),
        **_figures(config, spec),
        "special_tokens": _specials(folder),
        "moe": _moe(spec, tensors, parameters) if spec else None,
    }


def _token(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "none"
    return f"{entry['id']}" + (f" {entry['token']}" if entry["token"] is not None else "")


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} ({n} tensors)" for kind, n in counts.items()) or "none"


def _moe_line(report: Mapping[str, Any]) -> str:
    moe = report["moe"]
    return (
        f"{moe['experts']} experts, top {moe['top_k']}, {moe['shared_experts']} shared, "
        f"intermediate {moe['intermediate_size']}, in {len(moe['moe_layers'])} of "
        f"{report['num_hidden_layers']} layers, stored {moe['experts_stored']}; "
        f"{moe['active_parameters']:,} parameters active per token"
    )


def _parameters_line(r: Mapping[str, Any]) -> str:
    if r.get("parameters_from") == "config":
        return f"{r['parameters']:,}, counted from config.json (no weights stored)"
    return f"{r['parameters']:,} in {r['tensors']} tensors"


def _tokenizer_line(options: Sequence[str]) -> str:
    if "hf" in options:
        return "tokenizer=hf (its tokenizer.json) or tokenizer=byte"
    return "tokenizer=byte only: no tokenizer.json, which tokenizer=hf reads"


def render(report: Mapping[str, Any]) -> str:
    """The report as aligned lines for a terminal."""
    r = report
    specials = r["special_tokens"]
    eos = ", ".join(_token(e) for e in specials["eos"]) or "none"
    tokens = f"BOS {_token(specials['bos'])}; EOS {eos}; PAD {_token(specials['pad'])}"
    shape = (
        f"{r['num_hidden_layers']}, hidden {r['hidden_size']}, "
        f"intermediate {r['intermediate_size']}, vocab {r['vocab_size']}"
    )
    heads = (
        f"{r['num_attention_heads']} heads, {r['num_key_value_heads']} KV heads, "
        f"head_dim {r['head_dim']}" + (", q/k norm" if r.get("qk_norm") else "")
    )
    window = f", sliding window {r['sliding_window']}" if r.get("sliding_window") else ""
    rows = [
        ("folder", r["folder"]),
        ("architecture", r["architecture"]),
        ("servable", "yes" if r["servable"] else f"no: {r['reason']}"),
        ("parameters", _parameters_line(r)),
        ("tokenizer", _tokenizer_line(r["tokenizers"])),
        ("dtype", f"stored {_counts(r['stored_dtypes'])}; config {r['config_dtype']}"),
        ("layers", shape),
        ("attention", heads),
        ("context", f"{r['max_position_embeddings']} positions" + window),
        ("tokens", tokens + ("" if specials["tokenizer_json"] else " (no tokenizer.json)")),
    ]
    if r.get("rope_theta") is not None:
        rows.append(("rope", f"theta {r['rope_theta']:g}, scaling {r['rope_scaling']}"))
    if r.get("moe"):
        rows.append(("moe", _moe_line(r)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def check_readable(path: str) -> None:
    """NotAModel for a path that is neither a folder nor a regular GGUF file, said as such."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        if not target.is_file() or target.stat().st_size == 0 or not is_gguf(target):
            raise NotAModel(
                f"MODEL_DIR={target} is a file but not a GGUF file (no GGUF magic): give a "
                "model folder (config.json, *.safetensors) or a .gguf file"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.inspect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python -m pipeline.inspect ~/models/Llama-3.1-8B --max-model-len 8192",
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="a model folder or a .gguf file")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="the context it would be served with (default: max_position_embeddings)",
    )
    args = parser.parse_args(argv)
    try:
        check_readable(args.model_dir)
        if is_gguf(args.model_dir):
            report = describe_gguf(args.model_dir, args.max_model_len)
            text = render_gguf(report)
        else:
            report = describe(args.model_dir, args.max_model_len)
            text = render(report)
    except ValueError as err:  # NotAModel, or a GGUF header that cannot be read
        print(f"Error: {err}", file=sys.stderr)
        return NOT_A_MODEL
    except OSError as err:  # a device or a file that cannot be read (/proc/self/mem)
        print(f"Error: {args.model_dir} cannot be read ({err.strerror or err})", file=sys.stderr)
        return NOT_A_MODEL
    print(json.dumps(report, indent=2) if args.json else text)
    return SERVABLE if report["servable"] else NOT_SERVABLE
