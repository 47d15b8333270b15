"""The `_target_`s a run folder written by an earlier release may name, and what each is
now: a folder stopped before an upgrade resumes after it (pipeline/run_folder/resume.py). A target
not listed is left as it is."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig

# Every target the configs named before stages/ was regrouped into packages by job.
FORMER_TARGETS: dict[str, str] = {
    "pipeline.schema.measured_profile": "pipeline.profiles.measured_profile",
    "stages.attention.paged.PagedAttention": "stages.model.attention.paged.PagedAttention",
    "stages.attention.reference.ReferenceAttention": (
        "stages.model.attention.reference.ReferenceAttention"
    ),
    "stages.checkpoint.load_hf_model": "stages.loading.checkpoint.load_hf_model",
    "stages.gguf.loader.load_gguf_model": "stages.loading.gguf.loader.load_gguf_model",
    "stages.gguf.tokenizer.GgufTokenizer": "stages.loading.gguf.tokenizer.GgufTokenizer",
    "stages.metadata.HPUMetadataBuilder": "stages.forward.metadata.BucketedMetadataBuilder",
    "stages.model.transformer_lm": "stages.model.transformer.transformer_lm",
    "stages.model_spec.model_spec": "stages.model.spec_option.model_spec",
    "stages.sampler.GreedySampler": "stages.sampling.sampler.GreedySampler",
    "stages.sampler.RandomSampler": "stages.sampling.sampler.RandomSampler",
    "stages.scheduler.ChunkedScheduler": "stages.scheduling.scheduler.ChunkedScheduler",
    "stages.scheduler.StaticScheduler": "stages.scheduling.whole_prompt.StaticScheduler",
    "stages.scheduler.WholeScheduler": "stages.scheduling.whole_prompt.WholeScheduler",
    "stages.tokenizer.ByteTokenizer": "stages.loading.tokenizer.ByteTokenizer",
    "stages.tokenizer.HfTokenizer": "stages.loading.tokenizer.HfTokenizer",
}


def rename_targets(node: Any) -> None:
    """Every former `_target_` under `node` (a config read from a run folder), renamed in
    place to what it is now."""
    if isinstance(node, ListConfig):
        for index in range(len(node)):
            rename_targets(node._get_node(index))
    if not isinstance(node, DictConfig):
        return
    for key in list(node.keys()):
        child = node._get_node(key)  # as written: no interpolation resolved, none missing
        if isinstance(child, (DictConfig, ListConfig)):
            rename_targets(child)
        elif key == "_target_" and child is not None and child._value() in FORMER_TARGETS:
            node[key] = FORMER_TARGETS[child._value()]
