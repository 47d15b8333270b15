"""The `model=spec` option: a model's description from its config.json (read as a
checkpoint's), or from the fields a preset gives (conf/model/spec/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stages.loading.checkpoint import read_json, read_spec
from stages.model.spec import Checkpoint, ModelSpec, MoeLayout, even_head_dim, moe_layers


def spec_from_file(config: str, name: str = "", dtype_bytes: int = 2) -> ModelSpec:
    """The spec of a config.json (or of the folder holding one), checked as a checkpoint's."""
    path = Path(config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    checkpoint = read_spec(read_json(path))
    return dataclasses.replace(
        checkpoint.model,
        name=name or path.parent.name,
        dtype_bytes=dtype_bytes,
    )


def model_spec(
    *,
    config: str,
    name: str,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    tied_embeddings: bool,
    qkv_bias: bool,
    num_experts: int,
    experts_per_token: int,
    expert_intermediate_size: int,
    num_shared_experts: int,
    moe_layer_start: int,
    moe_layer_end: int,
    moe_layer_interval: int,
    dtype_bytes: int,
    max_position_embeddings: int,
    architecture: str,
    mtp_layers: int,
    fp8_checkpoint: str,
) -> ModelSpec:
    """The `model=spec` option: config.json at `config`, or else the fields given."""
    _check_one_source(config, hidden_size, has_fields=bool(hidden_size or num_layers or vocab_size))
    if config:
        return spec_from_file(config, name, dtype_bytes)
    experts = (num_experts, experts_per_token, expert_intermediate_size, num_shared_experts)
    moe = _moe_layout(num_layers, *experts, moe_layer_start, moe_layer_end, moe_layer_interval)
    return ModelSpec(
        name=name or "spec",
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim or even_head_dim(hidden_size, num_heads),
        intermediate_size=intermediate_size,
        tied_embeddings=tied_embeddings,
        qkv_bias=qkv_bias,
        dtype_bytes=dtype_bytes,
        moe=moe,
        max_position_embeddings=max_position_embeddings,
        checkpoint=Checkpoint(architecture, mtp_layers, fp8_checkpoint),
    )


def _check_one_source(config: str, hidden_size: int, has_fields: bool) -> None:
    """A spec comes from config.json or from its fields: one of them, not both."""
    if config and has_fields:
        raise ValueError(
            "model.config is given with architecture fields too: give either "
            "model.config=PATH or the fields (a model=spec/NAME preset), not both"
        )
    if not config and not hidden_size:
        raise ValueError(
            "model=spec has no architecture: give model.config=PATH (a config.json or its "
            "folder) or choose a preset, e.g. model=spec/llama31_8b"
        )


def _moe_layout(
    num_layers: int,
    num_experts: int,
    experts_per_token: int,
    expert_intermediate_size: int,
    num_shared_experts: int,
    start: int,
    end: int,
    interval: int,
) -> MoeLayout | None:
    """The routed experts of a spec's fields (None without experts); `interval` is checked
    either way, as a preset may set it for a dense model."""
    if interval < 1:
        raise ValueError(f"model.moe_layer_interval={interval} must be >= 1")
    if not num_experts:
        return None
    layers = moe_layers(num_layers, start, end, interval)
    return MoeLayout(
        num_experts, experts_per_token, expert_intermediate_size, num_shared_experts, layers
    )
