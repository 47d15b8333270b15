"""`python -m pipeline.inspect FILE.gguf`: what a GGUF file holds and whether this engine can
serve it, from its header alone (no tensor data is read)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from stages.loading.checkpoint import weight_plan
from stages.loading.gguf.config import ARCHITECTURES, check_gguf_context, gguf_spec, token_ids
from stages.loading.gguf.loader import check_tensors
from stages.loading.gguf.reader import GgufHeader, read_gguf_header
from stages.loading.gguf.vocab import vocab_style
from stages.model.rope import rope_type


def _servable(header: GgufHeader, context: int) -> tuple[Any, str | None]:
    """(spec or None, None or the one line saying why it cannot be served)."""
    spec = None
    try:
        spec = gguf_spec(header)
        check_gguf_context(header, spec, context or spec.max_position_embeddings)
        check_tensors(header, weight_plan(spec))
        vocab_style(header.metadata)
    except ValueError as err:
        return spec, str(err)
    return spec, None


def _specials(header: GgufHeader) -> dict[str, Any]:
    tokens = header.metadata.get("tokenizer.ggml.tokens") or []

    def named(name: str) -> list[dict[str, Any]]:
        return [
            {"id": i, "token": tokens[i] if 0 <= i < len(tokens) else None}
            for i in token_ids(header, name)
        ]

    return {
        "bos": named("bos"),
        "eos": named("eos") + named("eot") + named("eom"),
        "pad": named("padding"),
        "add_bos": bool(header.metadata.get("tokenizer.ggml.add_bos_token", False)),
    }


def describe_gguf(path: str, max_model_len: int = 0) -> dict[str, Any]:
    """The report of a GGUF file; ValueError when its header cannot be read."""
    header = read_gguf_header(path, key="FILE")
    spec, reason = _servable(header, max_model_len)
    meta = header.metadata
    arch = meta.get("general.architecture")
    d = spec.model if spec else None
    return {
        "file": str(header.path),
        "gguf_version": header.version,
        "name": meta.get("general.name"),
        "architecture": arch,
        "supported_architectures": list(ARCHITECTURES),
        "servable": reason is None,
        "reason": reason,
        "parameters": sum(math.prod(t.shape) for t in header.tensors.values()),
        "tensors": len(header.tensors),
        "tensor_types": dict(Counter(t.type_name for t in header.tensors.values()).most_common()),
        "file_bytes": header.file_size,
        "num_hidden_layers": d.num_layers if d else meta.get(f"{arch}.block_count"),
        "hidden_size": d.hidden_size if d else meta.get(f"{arch}.embedding_length"),
        "intermediate_size": d.intermediate_size if d else None,
        "vocab_size": d.vocab_size if d else None,
        "num_attention_heads": d.num_heads if d else None,
        "num_key_value_heads": d.num_kv_heads if d else None,
        "head_dim": d.head_dim if d else None,
        "max_position_embeddings": spec.max_position_embeddings if spec else None,
        "rope_theta": spec.rope_theta if spec else None,
        "rope_scaling": rope_type(spec.rope_scaling) if spec else None,
        "tied_embeddings": spec.model.tied_embeddings if spec else None,
        "tokenizer": meta.get("tokenizer.ggml.model"),
        "pre_tokenizer": meta.get("tokenizer.ggml.pre"),
        "chat_template": isinstance(meta.get("tokenizer.chat_template"), str),
        "special_tokens": _specials(header),
    }


def _tokens(entries: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['id']} {e['token']}" for e in entries) or "none"


def render_gguf(r: Mapping[str, Any]) -> str:
    """The report as aligned lines for a terminal."""
    s = r["special_tokens"]
    types = ", ".join(f"{kind} ({n} tensors)" for kind, n in r["tensor_types"].items())
    rows = [
        ("file", f"{r['file']} (GGUF v{r['gguf_version']}, {r['file_bytes'] / 1e6:.1f} MB)"),
        ("name", r["name"]),
        ("architecture", r["architecture"]),
        ("servable", "yes" if r["servable"] else f"no: {r['reason']}"),
        ("parameters", f"{r['parameters']:,} in {r['tensors']} tensors"),
        ("quantisation", types),
        (
            "layers",
            f"{r['num_hidden_layers']}, hidden {r['hidden_size']}, intermediate "
            f"{r['intermediate_size']}, vocab {r['vocab_size']}",
        ),
        (
            "attention",
            f"{r['num_attention_heads']} heads, {r['num_key_value_heads']} KV heads, "
            f"head_dim {r['head_dim']}",
        ),
        ("context", f"{r['max_position_embeddings']} positions"),
        ("rope", f"theta {r['rope_theta']}, scaling {r['rope_scaling']}"),
        (
            "tokenizer",
            f"{r['tokenizer']} (pre {r['pre_tokenizer']}), chat template "
            f"{'yes' if r['chat_template'] else 'no'}",
        ),
        (
            "tokens",
            f"BOS {_tokens(s['bos'])} (added: {'yes' if s['add_bos'] else 'no'}); "
            f"EOS {_tokens(s['eos'])}; PAD {_tokens(s['pad'])}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
