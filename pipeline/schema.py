"""Structured-config schemas: every group option's keys and types, checked at composition.

Each YAML option in conf/ names its schema (group `schema/<group>`) first in its defaults
list, so a misspelt key, a wrong type or a missing value fails with Hydra's own message
before anything runs.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING, DictConfig, OmegaConf

from stages.forward.buckets import Bucketing
from stages.forward.engine_grids import FastDeploySteps
from stages.model.spec import ModelSpec, built_in_spec, dtype_bytes
from stages.model.spec_option import model_spec
from stages.scheduling.chunk_policy import Budget
from stages.simulator.hardware import HardwareProfile, read_profile
from stages.simulator.precision import KvCacheDtype, Quantization


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
    # prompts prefilled in one step at most; 0 = no cap (FastDeploy caps them at its
    # MAX_PREFILL_NUM, 3: set 3 to serve as it does)
    max_prefill_rows: int = 0


@dataclass
class ChunkedSchedulerConf(SchedulerConf):
    _target_: str = "stages.scheduling.scheduler.ChunkedScheduler"
    align_chunks: bool = True  # non-final chunks are whole blocks (the HPU rule)
    long_prefill_threshold: int = 0  # cap on one request's chunk, tokens; 0 = off


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
    sequence_step_prefill: int = _FD.sequence_step_prefill
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
    bucketing: Bucketing = _by_device("bucketing", "${oc.select:plan.hpu_bucketing,linear}")
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
    ops: str = "cpu"  # cpu (plain Paddle) or intel_hpu (the plugin's ops)


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


class ModelOption(Protocol):
    """What a `model` option's schema says of the model it builds, before it is built: the
    memory check, the simulated device and calibration size a model from this alone."""

    has_weights: ClassVar[bool]  # False: a description only, for the simulated device

    def spec(self) -> ModelSpec:
        """The model's description; ValueError names the key or file at fault."""

    def rotary_positions(self) -> int:
        """Positions of the rotary table the model would build (0: none)."""


# The compute dtype a model's weights and activations take unless its option says otherwise:
# Paddle's CPU kernels are float32 (bf16 runs where the device has bf16 matmuls).
COMPUTE_DTYPE = "float32"


@dataclass
class TransformerConf:
    _target_: str = "stages.model.transformer.transformer_lm"
    vocab_size: int = MISSING
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    intermediate_size: int = MISSING
    max_position: int = II("max_model_len")
    head_dim: int = 0  # 0 = hidden_size / num_heads
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = II("seed")
    dtype: str = COMPUTE_DTYPE

    has_weights: ClassVar[bool] = True

    def spec(self) -> ModelSpec:
        sizes = (self.vocab_size, self.hidden_size, self.num_layers, self.num_heads)
        widths = (self.num_kv_heads, self.intermediate_size, self.head_dim)
        return built_in_spec(*sizes, *widths, dtype=self.dtype)

    def rotary_positions(self) -> int:
        return self.max_position


@dataclass
class HfModelConf:
    _target_: str = "stages.loading.checkpoint.load_hf_model"
    path: str = MISSING  # a local Hugging Face-format folder
    dtype: str = COMPUTE_DTYPE  # stored bf16 / fp16 / fp32 weights are converted to it
    max_position: int = II("max_model_len")  # rotary table; 0 = max_position_embeddings

    has_weights: ClassVar[bool] = True

    def spec(self) -> ModelSpec:
        from stages.loading.checkpoint import read_folder_spec

        checkpoint = read_folder_spec(self.path)
        name = Path(self.path).expanduser().name
        return dataclasses.replace(
            checkpoint.model,
            name=name,
            dtype_bytes=dtype_bytes(self.dtype),
        )

    def rotary_positions(self) -> int:
        from stages.loading.checkpoint import read_folder_spec

        return self.max_position or read_folder_spec(self.path).max_position_embeddings


@dataclass
class GgufModelConf:
    _target_: str = "stages.loading.gguf.loader.load_gguf_model"
    path: str = MISSING  # a GGUF file (llama, qwen2, qwen3; F32 to Q4_K: docs/checkpoints.md)
    dtype: str = COMPUTE_DTYPE  # every stored type is dequantised to it
    max_position: int = II("max_model_len")  # rotary table; 0 = the file's context_length

    has_weights: ClassVar[bool] = True

    def spec(self) -> ModelSpec:
        from stages.loading.gguf.config import gguf_spec
        from stages.loading.gguf.reader import read_gguf_header

        checkpoint = gguf_spec(read_gguf_header(self.path))
        name = Path(self.path).expanduser().stem
        return dataclasses.replace(
            checkpoint.model,
            name=name,
            dtype_bytes=dtype_bytes(self.dtype),
        )

    def rotary_positions(self) -> int:
        from stages.loading.gguf.config import gguf_spec
        from stages.loading.gguf.reader import read_gguf_header

        if self.max_position:
            return self.max_position
        return gguf_spec(read_gguf_header(self.path)).max_position_embeddings


@dataclass
class WorkloadConf:
    _target_: str = MISSING
    concurrency: int = 0  # most requests in flight (closed loop); 0 = open loop


@dataclass
class SyntheticWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.SyntheticWorkload"
    num_requests: int = 16
    min_prompt_tokens: int = 16
    max_prompt_tokens: int = 1200
    min_new_tokens: int = 8
    max_new_tokens: int = 32
    ignore_eos: bool = True
    rate: float = 0.0  # Poisson arrivals, requests/s; 0 = all at once
    start_s: float = 0.0  # arrivals begin here, seconds after the start
    seed: int = II("seed")
    shared_prefix_tokens: int = 0  # each prompt starts with a shared prefix this long; 0 = none
    num_prefixes: int = 1  # distinct shared prefixes; request i has prefix i mod this


@dataclass
class MixedWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.MixedWorkload"
    parts: dict[str, SyntheticWorkloadConf] = field(default_factory=dict)


@dataclass
class MultiTurnWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.MultiTurnWorkload"
    num_conversations: int = 8
    turns: int = 4  # each turn's prompt: the previous prompt, its answer and a new question
    system_prompt_tokens: int = 256
    min_question_tokens: int = 16
    max_question_tokens: int = 64
    min_answer_tokens: int = 16  # the recorded answer's length is the turn's max_new_tokens
    max_answer_tokens: int = 64
    rate: float = 0.0  # conversations start as a Poisson process, per second; 0 = all at once
    turn_gap_s: float = 1.0  # a turn arrives this long after the previous one
    seed: int = II("seed")


@dataclass
class JsonlWorkloadConf(WorkloadConf):
    _target_: str = "stages.workload.JsonlWorkload"
    path: str = MISSING  # a jsonl file, one request per line
    num_requests: int = 0  # 0 = every line
    max_new_tokens: int = 64  # for lines that do not say
    rate: float = 0.0  # Poisson arrivals when lines give no arrival_s
    seed: int = II("seed")


@dataclass
class SpecModelConf:
    """A model without weights, for the simulated device: config.json or a preset's fields."""

    _target_: str = "stages.model.spec_option.model_spec"
    config: str = ""  # a config.json (or its folder); "" = the fields below
    name: str = ""
    vocab_size: int = 0
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0  # 0 = hidden_size / num_heads
    intermediate_size: int = 0
    tied_embeddings: bool = False
    qkv_bias: bool = False
    num_experts: int = 0  # routed experts; 0 = a dense model
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    moe_layer_start: int = 0
    moe_layer_end: int = -1  # -1 = the last layer
    moe_layer_interval: int = 1
    dtype_bytes: int = 2  # bf16
    # The context it was trained for (config.json's name); max_model_len may not exceed
    # it. 0: not stated, no limit.
    max_position_embeddings: int = 0

    has_weights: ClassVar[bool] = False

    def spec(self) -> ModelSpec:
        return model_spec(**{k: v for k, v in vars(self).items() if k != "_target_"})

    def rotary_positions(self) -> int:
        return 0


@dataclass
class HardwareConf:
    """A device's public figures and the cost model's (uncalibrated) factors."""

    _target_: str = "stages.simulator.hardware.HardwareProfile"
    name: str = MISSING
    bf16_tflops: float = MISSING  # dense peak
    hbm_bandwidth_gbs: float = MISSING
    hbm_capacity_gib: float = MISSING
    interconnect_gbs: float = MISSING  # per device, one direction
    gemm_efficiency: float = MISSING
    attention_efficiency: float = MISSING
    memory_efficiency: float = MISSING
    interconnect_efficiency: float = MISSING
    step_overhead_s: float = MISSING
    compile_s: float = MISSING  # one bucket's graph at warmup
    recompile_s: float = MISSING  # a bucket miss
    graph_memory_gib: float = MISSING
    kv_headroom: float = 0.1
    pads_to_buckets: bool = True
    fp8_tflops: float = 0.0  # dense FP8 peak; 0 = none (FP8 GEMMs at the bf16 rate)
    allreduce_latency_s: float = 0.0  # one all-reduce call's fixed time
    gemm_fill_s: float = 0.0  # one GEMM kernel's fixed time (thin GEMMs lose efficiency)
    interconnect_peer_gbs: float = 0.0  # all-to-all links: to one peer; 0 = a switch
    coefficients: dict[str, float] = field(default_factory=dict)  # fitted; empty = defaults
    software: str = ""  # the software release the fitted figures describe
    # relative prediction errors by method (offline, static, online): fit_median, fit_worst,
    # held_out_median, held_out_worst (a split-half fit's held-out rows); plan bands read them
    errors: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class MeasuredHardwareConf:
    _target_: str = "pipeline.schema.measured_profile"
    path: str = MISSING  # a profile YAML written by CostModel.write_profile


def schema_defaults(conf: type) -> dict[str, Any]:
    """The values a schema gives its keys by default: those set to a plain value (not
    MISSING, not an interpolation of another key), `_target_` left out."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(conf):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name == "_target_" or value is dataclasses.MISSING or value == MISSING:
            continue
        if not (isinstance(value, str) and value.startswith("${")):
            values[f.name] = value
    return values


def measured_profile(path: str) -> HardwareProfile:
    """`hardware=measured`: a profile YAML, whose fields the device schema gives a default
    (kv_headroom, fp8_tflops, ...) may be left out."""
    return read_profile(path, schema_defaults(HardwareConf))


@dataclass
class TraceWorkloadConf(WorkloadConf):
    _target_: str = "stages.trace.TraceWorkload"
    path: str = MISSING  # a trace file the user brings (docs/traces.md)
    format: str = "auto"  # auto, azure, burstgpt, mooncake, sharegpt, vidur
    model_filter: str = ""  # burstgpt: keep this model's rows; "" = all
    trace_block_size: int = 512  # mooncake: tokens per hash id
    time_scale: float = 1.0  # multiplies the gaps between arrivals
    start_s: float = 0.0  # window start, trace seconds after the shift
    duration_s: float = 0.0  # window length; 0 = to the end
    num_requests: int = 0  # the first N; 0 = all
    rate: float = 0.0  # sharegpt (no timestamps): Poisson arrivals, requests/s; 0 = all at once
    too_long: str = "clip"  # clip or error: prompts longer than max_model_len - 1
    seed: int = II("seed")
    max_model_len: int = II("max_model_len")
    max_num_seqs: int = II("max_num_seqs")


class Executor(enum.StrEnum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    paddle = "paddle"  # the real forward pass, in Paddle
    simulated = "simulated"  # a cost model of `hardware` in place of the forward pass


@dataclass
class PaddleExecutorConf:
    name: Executor = Executor.paddle


@dataclass
class SimulatedExecutorConf:
    name: Executor = Executor.simulated
    # Parts a prefill's batch is split into so that each part's all-reduces run under the
    # next part's compute (Optimum Habana's --attn_batch_split); 1 = no split.
    prefill_batch_split: int = 1


@dataclass
class CalibrateConf:
    """`python -m pipeline.calibrate`: which measured steps the cost model is fitted to."""

    grid_shapes: int = 0  # padding-only warmup shapes to time (a padding forward); 0 = none
    serve: bool = True  # serve the configured workload for real and fit its steps
    runs: list[str] = field(default_factory=list)  # real run folders whose steps to fit too


@dataclass
class ServeConf:
    """`python -m pipeline.serve`: the OpenAI-compatible server's knobs."""

    host: str = "127.0.0.1"  # 0.0.0.0 listens on every interface
    port: int = 8000
    api_key: str = ""  # a Bearer token /v1 routes require; empty = none
    model_name: str = ""  # the name /v1/models lists; empty = the model group's choice
    max_waiting: int = 256  # requests queued (not yet running) at most; beyond: 503
    max_request_bytes: int = 1_000_000  # larger request bodies get 413
    shutdown_timeout_s: float = 30.0  # SIGTERM: in-flight requests finish or abort by then
    header_timeout_s: float = 10.0  # a connection whose request head is not in by then closes
    body_timeout_s: float = 30.0  # a body not all in by then gets 408
    max_connections: int = 1000  # open connections at most; beyond: 503 (uvicorn's limit)
    # The KV pool's memory (executor=paddle): serve.kv_cache_memory_gb (vLLM's CPU backend
    # takes a fixed budget too), or with 0 this fraction of the memory available at start
    # (vLLM's gpu_memory_utilization); never more blocks than max_num_seqs full-length
    # requests take. num_blocks, where given, wins.
    kv_cache_memory_gb: float = 1.0
    kv_cache_memory_fraction: float = 0.1
    # Free C heap handed back to the system at most this often (glibc's malloc_trim), so
    # the resident size stays flat over days; 0 = never.
    trim_memory_s: float = 60.0


@dataclass
class SloConf:
    """Latency bounds a request must meet to count towards goodput (vLLM's --goodput)."""

    ttft_ms: float = 0.0  # arrival to the first token; 0 = no bound
    tpot_ms: float = 0.0  # (e2e - ttft) / (output tokens - 1); 0 = no bound
    e2e_ms: float = 0.0  # arrival to the last token; 0 = no bound
    attainment: float = 0.9  # fraction of requests that must meet every bound


@dataclass
class CapacityConf:
    """The capacity search of `python -m pipeline.plan` (pipeline/plan/capacity.py)."""

    max_probes: int = 12  # runs one search may make
    tolerance: float = 0.05  # rates: stop when the bracket's ends are within 5%
    keep_run_files: bool = False  # probes also write steps.jsonl and generations.jsonl
    decide_early: bool = True  # a probe stops once it has missed its SLO for certain
    estimate_start: bool = True  # first probe at the cost model's ceiling, not the workload's load


@dataclass
class PlanConf:
    """`python -m pipeline.plan`: how the configurations are ranked (pipeline/plan/report.py)."""

    objective: str = "goodput_per_card"  # without a target; or cost: per million output tokens
    # USD per card-hour by device (hardware.name), 0 = no price; conf/plan.yaml ships cited
    # on-demand prices, plan.prices.gaudi3=2.0 sets or overrides one (+plan.prices.NAME=X
    # for another profile). A device without one is not ranked by cost (the plan says so).
    prices: dict[str, float] = field(
        default_factory=lambda: {"h100": 0.0, "h200": 0.0, "gaudi2": 0.0, "gaudi3": 0.0}
    )
    # rule out longer predicted warmups: a readiness budget (an hour); 0 = none
    max_warmup_s: float = 3600.0
    model_id: str = ""  # what the deploy commands load; "" = the model's name
    # metadata.bucketing on a device that pads to buckets (Gaudi), where not given; a GPU
    # takes cudagraph. conf/plan.yaml: exponential, whose warmups fit plan.max_warmup_s.
    hpu_bucketing: str = "linear"
    # The load the deployment must serve (pipeline/plan/target.py): requests/s (open loop;
    # a trace's own rate as workload.time_scale scales it) or requests in flight (closed
    # loop); 0 = none (configurations ranked per card, not sized).
    target_rps: float = 0.0
    target_concurrency: int = 0


class SpeculativeMethod(enum.StrEnum):
    none = "none"
    mtp = "mtp"  # the model's own multi-token-prediction head (DeepSeek-V3, ERNIE-4.5)
    draft = "draft"  # a small draft model (`speculative.draft_model`)
    ngram = "ngram"  # prompt lookup: proposals copied from the request's own tokens


@dataclass
class DisaggConf:
    """executor=simulated: prefill/decode disaggregation. `prefill` instances run prompts to
    their first token, `decode` instances the rest, joined by a KV transfer; 0 and 0 = one
    aggregated instance. Each pool's limits default to the run's (0 = the run's value)."""

    prefill: int = 0  # prefill instances
    decode: int = 0  # decode instances
    prefill_tp: int = 0
    decode_tp: int = 0
    prefill_max_tokens: int = 0
    decode_max_num_seqs: int = 0
    link_gbps: float = 0.0  # KV transfer link per instance, GB/s; 0 = the device profile's
    transfer_latency_s: float = -1.0  # per transfer; < 0 = the device profile's


@dataclass
class SpeculativeConf:
    """executor=simulated: speculative decoding; a draft proposes `tokens` per row and step,
    the model verifies them with one more, each accepted with `acceptance` (per position,
    the last value repeating)."""

    method: SpeculativeMethod = SpeculativeMethod.none
    tokens: int = 1  # proposed per row and step (FastDeploy's num_speculative_tokens)
    acceptance: list[float] = field(default_factory=lambda: [0.8])
    draft_model: str = ""  # method=draft: a model spec (spec/llama32_1b)
    mtp_layers: int = 1  # method=mtp: decoder layers of the prediction head (DeepSeek-V3: 1)


@dataclass
class PipelineConf:
    tokenizer: Any = MISSING
    scheduler: Any = MISSING
    metadata: Any = MISSING
    attention: Any = MISSING
    sampler: Any = MISSING
    model: Any = MISSING
    workload: Any = MISSING
    executor: Any = MISSING
    hardware: Any = None  # executor=simulated: the device profile (hardware=gaudi3, ...)
    tp: int = 1  # executor=simulated: tensor-parallel degree of the simulated deployment
    # executor=simulated, MoE models: experts split over ep ranks (1, or tp x dp as vLLM's
    # --enable-expert-parallel) and dp attention replicas; the device simulates one replica
    ep: int = 1
    dp: int = 1
    ep_imbalance: float = 1.0  # busiest ep rank's routed tokens / the mean (>= 1)
    disagg: DisaggConf = field(default_factory=DisaggConf)  # executor=simulated
    speculative: SpeculativeConf = field(default_factory=SpeculativeConf)  # executor=simulated
    # executor=simulated: weights' format (none = the model's bf16, fp8, wint8, wint4) and
    # the KV cache's (auto = the model's dtype, fp8); the real CPU path runs `none`/`auto`
    quantization: Quantization = Quantization.none
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.auto
    max_tokens: int = 512  # per-step token budget (FastDeploy's max_num_batched_tokens)
    block_size: int = 128  # KV-cache block, tokens
    max_num_seqs: int = 32  # requests in one step at most
    max_model_len: int = 2048  # prompt + output tokens of one request at most
    num_blocks: int = 0  # KV block pool size; 0 = derived so that the workload fits
    prefix_caching: bool = True  # reuse the KV blocks of a shared prompt prefix
    seed: int = 0  # model weights, workload and sampling streams
    device: str = "cpu"  # cpu, or intel_hpu where the plugin is installed
    warmup: bool = False  # run every bucket shape once before the workload
    num_threads: int = 2  # Paddle's CPU math threads
    calibrate: CalibrateConf = field(default_factory=CalibrateConf)  # pipeline.calibrate only
    serve: ServeConf = field(default_factory=ServeConf)  # pipeline.serve only
    slo: SloConf = field(default_factory=SloConf)  # goodput and attainment in metrics.json
    capacity: CapacityConf = field(default_factory=CapacityConf)  # pipeline.plan only
    plan: PlanConf = field(default_factory=PlanConf)  # pipeline.plan only


SCHEMAS = {
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
    ("model", "transformer"): TransformerConf,
    ("model", "hf"): HfModelConf,
    ("model", "gguf"): GgufModelConf,
    ("model", "spec"): SpecModelConf,
    ("hardware", "device"): HardwareConf,
    ("hardware", "measured"): MeasuredHardwareConf,
    ("workload", "synthetic"): SyntheticWorkloadConf,
    ("workload", "jsonl"): JsonlWorkloadConf,
    ("workload", "mixed"): MixedWorkloadConf,
    ("workload", "multiturn"): MultiTurnWorkloadConf,
    ("executor", "paddle"): PaddleExecutorConf,
    ("executor", "simulated"): SimulatedExecutorConf,
    ("workload", "trace"): TraceWorkloadConf,
}


MODEL_OPTIONS = (TransformerConf, HfModelConf, GgufModelConf, SpecModelConf)


def model_kind(node: DictConfig) -> type[ModelOption]:
    """The schema of the `model` option: each conf/model option names one first, so the
    kind of model is the config's own type. A config read back from a run folder has lost
    its types: the schema is then the one that declares the node's `_target_`."""
    kind = OmegaConf.get_type(node)
    if isinstance(kind, type) and issubclass(kind, MODEL_OPTIONS):
        return kind
    declared = {option._target_: option for option in MODEL_OPTIONS}
    target = node.get("_target_")
    if target not in declared:
        kinds = ", ".join(f"/schema/model@_here_: {n}" for (g, n) in SCHEMAS if g == "model")
        raise ValueError(f"model: the option names no model schema: begin it with one of {kinds}")
    return declared[target]


def model_option(node: DictConfig) -> ModelOption:
    """The `model` node as its schema's object, which describes the model it builds."""
    schema = OmegaConf.structured(model_kind(node))
    values = OmegaConf.to_container(node, resolve=True)  # interpolations name other keys
    return OmegaConf.to_object(OmegaConf.merge(schema, values))  # type: ignore[return-value]


def register_schemas() -> None:
    if not OmegaConf.has_resolver("device_default"):
        OmegaConf.register_new_resolver("device_default", device_default)
    store = ConfigStore.instance()
    store.store(name="pipeline_schema", node=PipelineConf)
    for (group, name), node in SCHEMAS.items():
        store.store(group=f"schema/{group}", name=name, node=node)
