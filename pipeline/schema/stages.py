"""Schemas of the engine's stages: tokenizer, scheduler, metadata (buckets), attention and
sampler options, each registered under its group (`schema/<group>`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II, MISSING

from stages.device import Device
from stages.forward.buckets import Bucketing
from stages.forward.cudagraph import CaptureRule
from stages.forward.engine_grids import FastDeploySteps
from stages.scheduling.admission import StepOrder
from stages.scheduling.chunk_policy import Budget


@dataclass
class ByteTokenizerConf:
    _target_: str = "stages.loading.tokenizer.ByteTokenizer"
    add_bos: bool = True


@dataclass
class HfTokenizerConf:
    _target_: str = "stages.loading.tokenizer.HfTokenizer"
    path: str = II("model.path")  # a folder holding tokenizer.json; the model's by default
    add_special_tokens: bool = True  # tokenizer.json's own template, as transformers encodes
    add_bos: bool = False  # also put the BOS id first when the template does not


@dataclass
class GgufTokenizerConf:
    _target_: str = "stages.loading.gguf.tokenizer.GgufTokenizer"
    path: str = II("model.path")  # a GGUF file; the model's by default
    add_bos: Any = None  # null = the file's tokenizer.ggml.add_bos_token


# The execution model a device implies, where the config does not say: a device that pads
# to buckets (an HPU) warms a bucket grid and charges a prefill row its padded width; one that
# computes the real tokens (a GPU, hardware.pads_to_buckets=false) captures CUDA graphs at
# vLLM's sizes (stages/forward/cudagraph.py) and charges real tokens. Without a device: the former.
DEVICE_DEFAULTS = {
    "bucketing": (Bucketing.linear.value, Bucketing.cudagraph.value),
    "budget": (Budget.padded.value, Budget.real.value),
}


def device_default(key: str, pads: Any, padding_choice: str = "") -> str:
    """The default of `key` (bucketing, budget) for a device that pads or does not; a
    padding device takes `padding_choice` where one is given (plan.hpu_bucketing)."""
    padding, real = DEVICE_DEFAULTS[key]
    if pads is False or str(pads).lower() == "false":
        return real
    return padding_choice or padding


def _by_device(key: str, padding_choice: str = "") -> Any:
    pads = "${oc.select:hardware.pads_to_buckets,true}"
    return II(f"device_default:{key},{pads}" + (f",{padding_choice}" if padding_choice else ""))


@dataclass
class SchedulerConf:
    _target_: str = MISSING
    max_tokens: int = II("max_tokens")
    max_num_seqs: int = II("max_num_seqs")
    max_model_len: int = II("max_model_len")
    # padded: a prefill row costs its padded width; real: tokens; default: the device's
    budget: Budget = _by_device("budget")
    max_padding: float = 0.25  # a row joins a step's prefill rectangle only below this padding
    # admit a request only when the KV pool holds it to its end beside what the running
    # requests will still take: no preemption (TensorRT-LLM's GUARANTEED_NO_EVICT)
    no_evict: bool = False
    # prompts prefilled in one step at most; 0 = no cap; default: the engine's (engine=)
    max_prefill_rows: int = II("oc.select:engine.max_prefill_rows,0")
    # decode_first: running rows then new prompts in one mixed step; prefill_first: a step of
    # prefill chunks alone while prompts wait (SGLang's); default: the engine's
    step_order: StepOrder = II("oc.select:engine.step_order,decode_first")


@dataclass
class ChunkedSchedulerConf(SchedulerConf):
    _target_: str = "stages.scheduling.scheduler.ChunkedScheduler"
    align_chunks: bool = True  # non-final chunks are whole blocks (the HPU rule)
    # cap on one request's chunk, tokens; 0 = off; default: the engine's
    long_prefill_threshold: int = II("oc.select:engine.long_prefill_threshold,0")


@dataclass
class WholeSchedulerConf(SchedulerConf):
    _target_: str = "stages.scheduling.whole_prompt.WholeScheduler"


@dataclass
class StaticSchedulerConf(SchedulerConf):
    _target_: str = "stages.scheduling.whole_prompt.StaticScheduler"


@dataclass
class BucketAxisConf:
    """The prepared sizes of one bucket dimension: `sizes`, or min/step/max. 0 derives a
    value from the limits (min: 1 or block_size; step: 1 or block_size; max: max_num_seqs,
    max_tokens or max_model_len / block_size; for decode_blocks, all rows' blocks up to the
    pool, or with prefix caching up to max_num_seqs full rows, as rows sharing a cached
    prefix list its blocks each)."""

    min: int = 0
    step: int = 0
    max: int = 0
    # The prepared sizes themselves, increasing (a planned set); non-empty wins over
    # min/step/max, whose step still rounds a miss's fallback shape.
    sizes: list[int] = field(default_factory=list)


def _axis(min: int = 0, step: int = 0) -> Any:
    return field(default_factory=lambda: BucketAxisConf(min=min, step=step))


_FD = FastDeploySteps()  # FastDeploy's own defaults, kept in one place


@dataclass
class FastDeployWarmupConf:
    """FastDeploy's HPU warmup environment (read with metadata.bucketing=fastdeploy),
    under its names lower-cased; the meanings and defaults are stages.forward.engine_grids'
    FastDeploySteps' (FastDeploy's own)."""

    max_prefill_num: int = _FD.max_prefill_num
    batch_step_prefill: int = _FD.batch_step_prefill
    sequence_step_prefill: int = II("block_size")  # FastDeploy's: "same as block size"
    context_block_step_prefill: int = _FD.context_block_step_prefill
    batch_step_decode: int = _FD.batch_step_decode
    block_step_decode: int = _FD.block_step_decode
    warmup_model_len: int = _FD.warmup_model_len
    recipe_cache_num: int = _FD.recipe_cache_num  # a grid of more recipes is warned about
    enc_dec_block_num: int = _FD.enc_dec_block_num


@dataclass
class BucketedMetadataConf:
    _target_: str = "stages.forward.metadata.BucketedMetadataBuilder"
    max_tokens: int = II("max_tokens")
    max_num_seqs: int = II("max_num_seqs")
    max_model_len: int = II("max_model_len")
    # linear, exponential, or cudagraph (a GPU's); default: the device's (DEVICE_DEFAULTS)
    # (a padding device's choice: the engine's grid, engine.hpu_bucketing)
    bucketing: Bucketing = _by_device("bucketing", "${oc.select:engine.hpu_bucketing,linear}")
    # a GPU's CUDA-graph sizes (bucketing=cudagraph): whose rule, and its largest size
    capture: CaptureRule = II("oc.select:engine.capture,vllm")
    capture_max_batch: int = II("oc.select:engine.capture_max_batch,0")
    # a mixed step also compiles its token-wise ops at its total tokens (FastDeploy's HPU
    # runner: engine_grids.step_graphs); false: its parts' graphs only; default: the engine's
    step_recipes: bool = II("oc.select:engine.step_recipes,false")
    prefill_batch: BucketAxisConf = _axis(min=1, step=1)
    prefill_seq: BucketAxisConf = _axis()  # tokens, multiples of block_size
    prefill_blocks: BucketAxisConf = _axis(min=1, step=2)  # context + chunk blocks per row
    decode_batch: BucketAxisConf = _axis(min=1, step=4)
    decode_blocks: BucketAxisConf = _axis(min=1, step=8)  # blocks of all rows together
    # Decode reads one contiguous span of the pool (blocks of other requests masked out)
    # while its bucket is at most this many times the rows' own blocks; otherwise blocks are
    # listed row by row. A span needs no gather on the CPU; 0 always lists row by row.
    decode_span: float = 2.0
    # warmup=true stops at start when the set holds more shapes than this; 0 = no limit.
    max_warmup_shapes: int = 512
    fastdeploy: FastDeployWarmupConf = field(default_factory=FastDeployWarmupConf)


@dataclass
class PagedAttentionConf:
    _target_: str = "stages.model.attention.paged.PagedAttention"
    ops: Device = Device.cpu  # cpu (plain Paddle) or intel_hpu (the plugin's ops)


@dataclass
class ReferenceAttentionConf:
    _target_: str = "stages.model.attention.reference.ReferenceAttention"


@dataclass
class SamplerConf:
    _target_: str = MISSING
    logprobs: int = 0  # top-k log-probabilities per generated token; 0 = off


@dataclass
class GreedySamplerConf(SamplerConf):
    _target_: str = "stages.sampling.sampler.GreedySampler"


@dataclass
class RandomSamplerConf(SamplerConf):
    _target_: str = "stages.sampling.sampler.RandomSampler"
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int = II("seed")


SCHEMAS: dict[tuple[str, str], type] = {
    ("tokenizer", "byte"): ByteTokenizerConf,
    ("tokenizer", "hf"): HfTokenizerConf,
    ("tokenizer", "gguf"): GgufTokenizerConf,
    ("scheduler", "chunked"): ChunkedSchedulerConf,
    ("scheduler", "whole"): WholeSchedulerConf,
    ("scheduler", "static"): StaticSchedulerConf,
    ("metadata", "bucketed"): BucketedMetadataConf,
    ("attention", "paged"): PagedAttentionConf,
    ("attention", "reference"): ReferenceAttentionConf,
    ("sampler", "greedy"): GreedySamplerConf,
    ("sampler", "random"): RandomSamplerConf,
}
