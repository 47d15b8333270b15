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
    # -- limits on each device --
    hpu: EngineDeviceConf = field(default_factory=EngineDeviceConf)
    gpu: EngineDeviceConf = field(default_factory=EngineDeviceConf)
    source: str = ""  # where the values were read (repository, file, release)


SCHEMAS: dict[tuple[str, str], type] = {("engine", "profile"): EngineConf}
