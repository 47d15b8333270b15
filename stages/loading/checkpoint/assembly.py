"""The loaded tensors assembled into TransformerLM: `load_hf_model`, the `model=hf` option."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from stages.loading.checkpoint.config import CheckpointSpec, check_context, read_spec
from stages.loading.checkpoint.folder import model_folder, read_json, read_special_ids, weight_files
from stages.loading.checkpoint.reading import load_state
from stages.loading.checkpoint.weight_plan import weight_plan
from stages.model.spec import dtype_bytes

if TYPE_CHECKING:  # the model and its weights are Paddle tensors
    import paddle

    from stages.model.transformer import DenseMLP, ModelWeights, MoeMLP, TransformerLM


def assemble_weights(spec: CheckpointSpec, state: Mapping[str, paddle.Tensor]) -> ModelWeights:
    from stages.model.transformer import DenseMLP, LayerWeights, ModelWeights, MoeMLP

    def mlp(prefix: str) -> DenseMLP:
        return DenseMLP(
            state[prefix + ".gate_up"],
            state[prefix + ".down"],
            state.get(prefix + ".gate_up.bias"),
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


def load_hf_model(path: str, dtype: str, max_position: int) -> TransformerLM:
    """The model of a local Hugging Face folder, in compute dtype `dtype`, with rotary tables
    for `max_position` positions (0 = the config's max_position_embeddings)."""
    from stages.model.transformer import check_dtype

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
    return assemble_model(spec, state, dtype, max_position, special.eos_ids)


def assemble_model(
    spec: CheckpointSpec,
    state: Mapping[str, paddle.Tensor],
    dtype: str,
    max_position: int,
    eos_ids: Iterable[int],
) -> TransformerLM:
    """The TransformerLM of a checked spec and its loaded tensors, whichever file held them,
    with rotary tables for `max_position` positions (0 = the model's context length)."""
    from stages.model.transformer import TransformerLM

    return TransformerLM(
        replace(spec.model, dtype_bytes=dtype_bytes(dtype)),
        max_position=max_position or spec.max_position_embeddings,
        rope_theta=spec.rope_theta,
        rms_eps=spec.rms_eps,
        dtype=dtype,
        rope_scaling=spec.rope_scaling,
        rope_interleaved=spec.rope_interleaved,
        weights=assemble_weights(spec, state),
        eos_ids=eos_ids,
    )
