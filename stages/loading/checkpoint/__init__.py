"""Hugging Face-format checkpoints: a local folder of config.json and *.safetensors.

`load_hf_model` (the `model=hf` option) reads Llama, Mistral, Qwen2, Qwen3, ERNIE-4.5 and
ERNIE-4.5 MoE folders into TransformerLM, under the architecture names of Baidu's
remote-code folders and of transformers' own classes, with MoE experts stored per expert
or fused (transformers 5). One module per job: `config` (config.json checked), `folder` (the
folder's files), `weight_plan` (where each tensor goes), `reading` (safetensors into the
layout), `assembly` (the model); `export` writes a built-in model as a Llama folder.
"""

from stages.loading.checkpoint.assembly import load_hf_model
from stages.loading.checkpoint.config import (
    SUPPORTED_ARCHITECTURES,
    CheckpointSpec,
    check_context,
    read_spec,
)
from stages.loading.checkpoint.folder import (
    INDEX_FILE,
    model_folder,
    read_folder_spec,
    read_json,
    read_special_ids,
    weight_files,
)
from stages.loading.checkpoint.reading import check_headers, load_state, read_header
from stages.loading.checkpoint.weight_plan import WeightPlan, weight_plan

__all__ = [
    "INDEX_FILE",
    "SUPPORTED_ARCHITECTURES",
    "CheckpointSpec",
    "WeightPlan",
    "check_context",
    "check_headers",
    "load_hf_model",
    "load_state",
    "model_folder",
    "read_folder_spec",
    "read_header",
    "read_json",
    "read_special_ids",
    "read_spec",
    "weight_files",
    "weight_plan",
]
