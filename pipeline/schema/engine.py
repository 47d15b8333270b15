"""The serving engine a run predicts (`engine=`): how that engine forms a step, which shapes
it warms or captures and pads to, and what it runs on each device. The values and their
sources are in conf/engine/*.yaml; the scheduler's and metadata builder's keys read them as
defaults, so scheduler.max_prefill_rows, metadata.bucketing and metadata.fastdeploy.* stay
overrides on top of a profile."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from omegaconf import MISSING

from stages.forward.buckets import Bucketing
from stages.forward.cudagraph import CaptureRule
from stages.scheduling.admission import StepOrder


class EngineName(enum.StrEnum):
    """Members are named by their values: OmegaConf matches a config value by name."""

    native = "native"  # this engine's own scheduler and bucket grids
    fastdeploy = "fastdeploy"  # PaddlePaddle/FastDeploy (its HPU runner on Gaudi)
    vllm = "vllm"  # vLLM V1 on GPUs, the vllm-gaudi plugin on Gaudi
    sglang = "sglang"
    trtllm = "trtllm"  # TensorRT-LLM's PyTorch backend (trtllm-serve)


@dataclass
class EngineDeviceConf:
    """What the engine runs on one kind of device (Gaudi: `hpu`, GPUs: `gpu`)."""

    runs: bool = True  # the engine serves on this device at all
    block_sizes: list[int] = field(default_factory=list)  # KV block sizes it takes; [] = any
    # the model architectures it serves there (config.json's `architectures`); [] = any
    architectures: list[str] = field(default_factory=list)


@dataclass
class EngineConf:
    name: EngineName = MISSING
    # -- step formation --
    # prompts one step may prefill; 0 = no cap besides max_tokens and max_num_seqs
    max_prefill_rows: int = 0
    # the order a step serves rows in (stages.scheduling.admission.StepOrder): running rows
    # first, then new prompts, in one mixed step; or prefill steps alone first (SGLang)
    step_order: StepOrder = StepOrder.decode_first
    long_prefill_threshold: int = 0  # cap on one prompt's chunk a step, tokens; 0 = off
    # -- shapes --
    hpu_bucketing: Bucketing = Bucketing.linear  # its warmup grid on a padding device
    capture: CaptureRule = CaptureRule.vllm  # its CUDA-graph batch sizes on a GPU
    capture_max_batch: int = 0  # the largest size it captures by default; 0 = no cap of its own
    # a mixed step also compiles its token-wise ops at its total tokens and rows, beside its
    # parts' graphs, as FastDeploy's HPU runner does (engine_grids.step_graphs); false: a
    # step's prefill and decode parts are its graphs
    step_recipes: bool = False
    # -- host time: what the engine's scheduling, input preparation and sampler wait add
    # to a step beyond the device profile's step_overhead_s (fitted on the release its
    # `software` names); 0: no more than that release's --
    step_host_s: float = 0.0  # a step's fixed part, seconds
    row_host_s: float = 0.0  # a part for each row (prompt or decode) the step runs, seconds
    # the rate its GEMM kernels reach, as a fraction of the device profile's
    # (gemm_efficiency, fitted on that release); 1: the same kernels' rate
    gemm_rate: float = 1.0
    # -- limits on each device --
    hpu: EngineDeviceConf = field(default_factory=EngineDeviceConf)
    gpu: EngineDeviceConf = field(default_factory=EngineDeviceConf)
    source: str = ""  # where the values were read (repository, file, release)
    # the release it describes where that is older than the one the deploy layer writes
    # scripts for (their flags are the current release's); "": the scripts' own release
    release: str = ""


SCHEMAS: dict[tuple[str, str], type] = {("engine", "profile"): EngineConf}
