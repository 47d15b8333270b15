"""Structured-config schemas: every group option's keys and types, checked at composition.

Each YAML option in conf/ names its schema (group `schema/<group>`) first in its defaults
list, so a misspelt key, a wrong type or a missing value fails with Hydra's own message
before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ByteTokenizerConf:
    _target_: str = "stages.tokenizer.ByteTokenizer"
    add_bos: bool = True


@dataclass
class HfTokenizerConf:
    _target_: str = "stages.tokenizer.HfTokenizer"
    path: str = MISSING  # a folder holding tokenizer.json
    add_special_tokens: bool = True
    add_bos: bool = False


@dataclass
class SchedulerConf:
    _target_: str = MISSING
    max_tokens: int = MISSING
    max_num_seqs: int = MISSING
    max_model_len: int = MISSING
    block_size: int = MISSING
    budget: str = "padded"  # padded: prefill rows cost their padded rectangle; real: tokens
    max_padding: float = 0.25  # most of a step's prefill rectangle a joining row may pad


@dataclass
class ChunkedSchedulerConf(SchedulerConf):
    _target_: str = "stages.scheduler.ChunkedScheduler"
    align_chunks: bool = True
    long_prefill_threshold: int = 0


@dataclass
class WholeSchedulerConf(SchedulerConf):
    _target_: str = "stages.scheduler.WholeScheduler"


@dataclass
class BucketAxisConf:
    min: int = 0  # 0 = derived from block_size, max_tokens, max_num_seqs, max_model_len
    step: int = 0
    max: int = 0


@dataclass
class HPUMetadataConf:
    _target_: str = "stages.metadata.HPUMetadataBuilder"
    block_size: int = MISSING
    max_tokens: int = MISSING
    max_num_seqs: int = MISSING
    max_model_len: int = MISSING
    bucketing: str = "linear"
    prefill_batch: BucketAxisConf = field(default_factory=BucketAxisConf)
    prefill_seq: BucketAxisConf = field(default_factory=BucketAxisConf)
    prefill_blocks: BucketAxisConf = field(default_factory=BucketAxisConf)
    decode_batch: BucketAxisConf = field(default_factory=BucketAxisConf)
    decode_blocks: BucketAxisConf = field(default_factory=BucketAxisConf)
    decode_span: float = 2.0


@dataclass
class PagedAttentionConf:
    _target_: str = "stages.attention.hpu.PagedAttention"
    block_size: int = MISSING
    ops: str = "cpu"


@dataclass
class ReferenceAttentionConf:
    _target_: str = "stages.attention.reference.ReferenceAttention"


@dataclass
class GreedySamplerConf:
    _target_: str = "stages.sampler.GreedySampler"
    logprobs: int = 0


@dataclass
class RandomSamplerConf:
    _target_: str = "stages.sampler.RandomSampler"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = MISSING
    logprobs: int = 0


@dataclass
class TransformerConf:
    _target_: str = "stages.model.TransformerLM"
    vocab_size: int = MISSING
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    intermediate_size: int = MISSING
    max_position: int = MISSING
    head_dim: int = 0  # 0 = hidden_size / num_heads
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = MISSING
    dtype: str = "float32"


@dataclass
class HfModelConf:
    _target_: str = "stages.checkpoint.load_hf_model"
    path: str = MISSING  # a local Hugging Face-format folder
    dtype: str = "float32"  # compute dtype
    max_position: int = 0  # rotary table length; 0 = the config's max_position_embeddings


@dataclass
class SyntheticWorkloadConf:
    _target_: str = "stages.workload.SyntheticWorkload"
    num_requests: int = 16
    min_prompt_tokens: int = 16
    max_prompt_tokens: int = 1200
    min_new_tokens: int = 8
    max_new_tokens: int = 32
    ignore_eos: bool = True
    rate: float = 0.0
    start_s: float = 0.0  # arrivals begin here
    seed: int = MISSING


@dataclass
class MixedWorkloadConf:
    _target_: str = "stages.workload.MixedWorkload"
    parts: dict[str, SyntheticWorkloadConf] = field(default_factory=dict)


@dataclass
class JsonlWorkloadConf:
    _target_: str = "stages.workload.JsonlWorkload"
    path: str = MISSING
    num_requests: int = 0  # 0 = every line
    max_new_tokens: int = 64  # for lines that do not say
    rate: float = 0.0
    seed: int = MISSING


@dataclass
class TraceWorkloadConf:
    _target_: str = "stages.trace.TraceWorkload"
    path: str = MISSING  # a trace file the user brings
    format: str = "auto"  # auto, azure, burstgpt, mooncake, sharegpt, vidur
    model_filter: str = ""  # burstgpt: keep this model's rows; "" = all
    trace_block_size: int = 512  # mooncake: tokens per hash id
    time_scale: float = 1.0  # multiplies the gaps between arrivals
    start_s: float = 0.0  # window start, trace seconds after the shift
    duration_s: float = 0.0  # window length; 0 = to the end
    num_requests: int = 0  # the first N; 0 = all
    rate: float = 0.0  # sharegpt (no timestamps): Poisson arrivals, requests/s; 0 = all at once
    too_long: str = "clip"  # clip or error: prompts longer than max_model_len - 1
    seed: int = MISSING
    max_model_len: int = MISSING
    max_num_seqs: int = MISSING


@dataclass
class PipelineConf:
    tokenizer: Any = MISSING
    scheduler: Any = MISSING
    metadata: Any = MISSING
    attention: Any = MISSING
    sampler: Any = MISSING
    model: Any = MISSING
    workload: Any = MISSING
    max_tokens: int = 512
    block_size: int = 128
    max_num_seqs: int = 32
    max_model_len: int = 2048
    num_blocks: int = 0  # 0 = derived so that the workload fits
    seed: int = 0
    device: str = "cpu"
    warmup: bool = False
    num_threads: int = 2


SCHEMAS = {
    ("tokenizer", "byte"): ByteTokenizerConf,
    ("tokenizer", "hf"): HfTokenizerConf,
    ("scheduler", "chunked"): ChunkedSchedulerConf,
    ("scheduler", "whole"): WholeSchedulerConf,
    ("metadata", "hpu"): HPUMetadataConf,
    ("attention", "hpu"): PagedAttentionConf,
    ("attention", "reference"): ReferenceAttentionConf,
    ("sampler", "greedy"): GreedySamplerConf,
    ("sampler", "random"): RandomSamplerConf,
    ("model", "transformer"): TransformerConf,
    ("model", "hf"): HfModelConf,
    ("workload", "synthetic"): SyntheticWorkloadConf,
    ("workload", "jsonl"): JsonlWorkloadConf,
    ("workload", "mixed"): MixedWorkloadConf,
    ("workload", "trace"): TraceWorkloadConf,
}


def register_schemas() -> None:
    store = ConfigStore.instance()
    store.store(name="pipeline_schema", node=PipelineConf)
    for (group, name), node in SCHEMAS.items():
        store.store(group=f"schema/{group}", name=name, node=node)
