"""How long a replica takes from start to serving its first request (`ready_s`), per engine.

    ready_s = weight load + graph capture or compile

- **Weight load**: the checkpoint's bytes at the deployed precision (every layer quantised,
  the embedding and lm head in the model's dtype: stages/simulator/precision.py) over
  `plan.load_gbs`, the storage's read bandwidth in GB/s (conf/plan.yaml cites its default).
  Every card of a replica reads its shard at once, so a replica's load is the whole
  checkpoint over one volume's bandwidth: a shared volume, as a checkpoint usually is.
- **Capture or compile**: the predicted warmup of the device (`predicted_warmup_s`: on a
  GPU one profiling prefill and one CUDA graph per capture size, on Gaudi every bucket
  compiled; `compile_s` each, conf/hardware/*.yaml), plus what the engine compiles besides:
  `ENGINE_COMPILE_S`.

Per engine: the run's `engine` (conf/engine/) names its script; engine=native stands for
every script the plan writes for the device. `plan.max_warmup_s` applies to the longest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Engines whose scripts the plan writes for a device (pipeline/deploy/), by script name.
GPU_ENGINES = ("vllm-cuda", "sglang", "trtllm", "fastdeploy-gpu")
HPU_ENGINES = ("vllm-gaudi", "fastdeploy-hpu")
# A run's `engine` (conf/engine/) as those scripts: native stands for every one of them.
SCRIPTS = {
    "vllm": ("vllm-cuda", "vllm-gaudi"), "sglang": ("sglang",), "trtllm": ("trtllm",),
    "fastdeploy": ("fastdeploy-gpu", "fastdeploy-hpu"),
}  # fmt: skip

# Seconds an engine compiles beyond its graph capture or bucket warmup, at a cold cache.
# vLLM (CUDA) runs torch.compile at start-up (its V1 default): the log of vLLM's own
# design page (vllm-project/vllm docs/design/v1/torch_compile.md, commit 08b8d6a,
# Llama-3.2-1B) shows Dynamo's trace from 03:06:54 to 03:07:07 (13 s) and Inductor's
# graphs from 03:52:37 to 03:52:45 (8 s): 21 s, a lower bound for larger models. The
# others capture CUDA graphs (SGLang, TensorRT-LLM's PyTorch backend, FastDeploy) or compile
# buckets (vllm-gaudi, FastDeploy on Gaudi) without a further compile by default.
ENGINE_COMPILE_S = {"vllm-cuda": 21.0}


@dataclass(frozen=True)
class Readiness:
    """One configuration's start-up: the weights' load and each engine's warmup."""

    load_s: float
    warmup_s: float  # the device's predicted capture or bucket compile
    by_engine: dict[str, float]  # ready_s per engine

    @property
    def ready_s(self) -> float:
        """The longest engine's: a deployment may use any of the scripts."""
        return max(self.by_engine.values())

    def as_metrics(self) -> dict[str, object]:
        return {"ready_s": self.ready_s, "load_s": self.load_s,
                "ready_s_by_engine": dict(self.by_engine)}  # fmt: skip


def readiness(
    weight_bytes: float,
    load_gbs: float,
    warmup_s: float,
    pads_to_buckets: bool,
    engine: str = "native",
) -> Readiness:
    """ready_s of the run's engine on the device (HPU scripts where it pads to buckets);
    engine=native: of every engine the plan writes a script for."""
    if load_gbs <= 0:
        raise ValueError(f"plan.load_gbs={load_gbs}: give the storage's GB/s, above 0")
    load_s = weight_bytes / (load_gbs * 1e9)
    engines: tuple[str, ...] = HPU_ENGINES if pads_to_buckets else GPU_ENGINES
    if engine in SCRIPTS:
        engines = tuple(e for e in engines if e in SCRIPTS[engine]) or engines
    by_engine = {e: load_s + warmup_s + ENGINE_COMPILE_S.get(e, 0.0) for e in engines}
    return Readiness(load_s, warmup_s, by_engine)


def describe(metrics: Mapping[str, object]) -> str:
    """One line of a job's readiness from its metrics (its parts)."""
    ready, load = metrics.get("ready_s"), metrics.get("load_s")
    if not isinstance(ready, (int, float)) or not isinstance(load, (int, float)):
        return ""
    return f"ready {ready:,.0f} s (weights {load:,.0f} s + capture or compile)"
