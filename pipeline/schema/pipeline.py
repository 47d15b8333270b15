"""The top-level schema (PipelineConf): the groups, the run's limits, and the keys of the
simulated deployment (tp, ep, dp, disaggregation, speculative decoding); the executor
options' schemas."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, cast

from omegaconf import MISSING, DictConfig

from pipeline.schema.plan import CalibrateConf, CapacityConf, PlanConf, SloConf
from pipeline.schema.serve import ServeConf
from stages.device import Device
from stages.simulator.expert_parallel import Dispatch
from stages.simulator.precision import KvCacheDtype, Quantization


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


# A key only the simulated executor reads: any other executor refuses it set away from its
# default, in one line (pipeline/config/executor_keys.py); declared here, with the key.
SIMULATED = {"executor": Executor.simulated}
# A key only the Paddle executor reads (the device its tensors live on, its math threads).
PADDLE = {"executor": Executor.paddle}


class SpeculativeMethod(enum.StrEnum):
    none = "none"
    mtp = "mtp"  # the model's own multi-token-prediction head (DeepSeek-V3, ERNIE-4.5)
    eagle = "eagle"  # an EAGLE / EAGLE-3 head: one decoder layer and the LM head
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
    prefill_dp: int = 0  # attention replicas an instance (with ep > 1, its experts' ranks)
    decode_dp: int = 0
    prefill_max_tokens: int = 0
    decode_max_num_seqs: int = 0
    link_gbps: float = 0.0  # KV transfer link per instance, GB/s; 0 = the device profile's
    transfer_latency_s: float = -1.0  # per transfer; < 0 = the device profile's
    transfer_piece_s: float = -1.0  # per piece (a layer's KV block); < 0 = the profile's
    # whose disaggregated path (router, first token, pull, pieces); "" = the run's `engine`
    engine: str = ""
    router_s: float = -1.0  # the router's hop; < 0 = the engine's figure
    # how the router picks a request's instance in each pool (pipeline/disagg/routing.py)
    router: str = "round_robin"


@dataclass
class SpeculativeConf:
    """executor=simulated: speculative decoding; a draft proposes `tokens` per row and step,
    the model verifies them with one more, each accepted with `acceptance` (per position,
    the last value repeating)."""

    method: SpeculativeMethod = SpeculativeMethod.none
    tokens: int = 1  # proposed per row and step (FastDeploy's num_speculative_tokens)
    # per position, the last value repeating: a list ([0.8, 0.6]) or one value (0.8), which
    # a sweep can list (speculative.acceptance=0.6,0.8); checked in pipeline/speculation/keys.py
    acceptance: Any = field(default_factory=lambda: [0.8])
    draft_model: str = ""  # method=draft: a model spec (spec/llama32_1b)
    mtp_layers: int = 1  # method=mtp: decoder layers of the prediction head (DeepSeek-V3: 1)
    # Share of decode rows a step has proposals for: prompt lookup proposes only where the
    # context's last n tokens occur before (benchmarks/spec_acceptance.py measures it); 1 = all
    proposal_rate: float = 1.0
    # Where acceptance and proposal rate come from: "published:DATASET" (the published
    # table's row for this model, method and k: pipeline/speculation/published_acceptance.py), or
    # the measurement that gave the values above (e.g. what benchmarks.spec_acceptance prints).
    # "" = assumed: a plan says "acceptance assumed" and ranks the row after the others.
    acceptance_from: str = ""
    # method=eagle, a tree as SGLang shapes it (0: vLLM's chain of `tokens`): passes of the
    # head (--speculative-num-steps), branches a node (--speculative-eagle-topk), tokens a
    # row verifies, the root included (--speculative-num-draft-tokens)
    steps: int = 0
    topk: int = 0
    draft_tokens: int = 0


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
    engine: Any = MISSING  # the serving engine predicted: conf/engine/ (native, fastdeploy, ...)
    hardware: Any = field(default=None, metadata=SIMULATED)  # the device profile (gaudi3, ...)
    tp: int = field(default=1, metadata=SIMULATED)  # the simulated deployment's tensor parallel
    # executor=simulated, MoE models: experts split over ep ranks (1, or tp x dp as vLLM's
    # --enable-expert-parallel) and dp attention replicas; the device simulates one replica
    ep: int = field(default=1, metadata=SIMULATED)
    dp: int = field(default=1, metadata=SIMULATED)
    # busiest ep rank's routed tokens / the mean (>= 1)
    ep_imbalance: float = field(default=1.0, metadata=SIMULATED)
    # MoE models at dp > 1: the relative spread of the replicas' step times, whose slowest
    # every step waits for (>= 0; none: the figure fitted in stages/simulator/expert_parallel.py)
    dp_step_spread: float | None = field(default=None, metadata=SIMULATED)
    # MoE routing read as uniform over E / skew experts (>= 1; 1: uniform): fewer distinct
    # experts a step touches (stages/simulator/moe_layer.py)
    moe_routing_skew: float = field(default=1.0, metadata=SIMULATED)
    # how tokens reach their experts' ranks: allgather (vLLM's default), per_rank (DeepEP
    # high-throughput), per_expert (DeepEP low-latency); stages/simulator/expert_parallel.py
    ep_dispatch: Dispatch = field(default=Dispatch.allgather, metadata=SIMULATED)
    disagg: DisaggConf = field(default_factory=DisaggConf, metadata=SIMULATED)
    speculative: SpeculativeConf = field(default_factory=SpeculativeConf, metadata=SIMULATED)
    # executor=simulated: weights' format (none = the model's bf16, fp8, wint8, wint4) and
    # the KV cache's (auto = the model's dtype, fp8); the real CPU path runs `none`/`auto`
    quantization: Quantization = field(default=Quantization.none, metadata=SIMULATED)
    kv_cache_dtype: KvCacheDtype = field(default=KvCacheDtype.auto, metadata=SIMULATED)
    max_tokens: int = 512  # per-step token budget (FastDeploy's max_num_batched_tokens)
    block_size: int = 128  # KV-cache block, tokens
    max_num_seqs: int = 32  # requests in one step at most
    max_model_len: int = 2048  # prompt + output tokens of one request at most
    num_blocks: int = 0  # KV block pool size; 0 = derived so that the workload fits
    prefix_caching: bool = True  # reuse the KV blocks of a shared prompt prefix
    seed: int = 0  # model weights, workload and sampling streams
    # cpu, or intel_hpu where the plugin is installed
    device: Device = field(default=Device.cpu, metadata=PADDLE)
    warmup: bool = False  # run every bucket shape once before the workload
    num_threads: int = field(default=2, metadata=PADDLE)  # Paddle's CPU math threads
    calibrate: CalibrateConf = field(default_factory=CalibrateConf)  # pipeline.calibrate only
    serve: ServeConf = field(default_factory=ServeConf)  # pipeline.serve only
    slo: SloConf = field(default_factory=SloConf)  # goodput and attainment in metrics.json
    capacity: CapacityConf = field(default_factory=CapacityConf)  # pipeline.plan only
    plan: PlanConf = field(default_factory=PlanConf)  # pipeline.plan only


def schema_view(cfg: DictConfig) -> PipelineConf:
    """The composed config read through its schema: the same DictConfig (Hydra composed it
    from PipelineConf, so OmegaConf holds each value to its field's type), seen as
    PipelineConf so that every top-level key a module reads is one mypy checks. No copy."""
    return cast(PipelineConf, cfg)


SCHEMAS: dict[tuple[str, str], type] = {
    ("executor", "paddle"): PaddleExecutorConf,
    ("executor", "simulated"): SimulatedExecutorConf,
}
