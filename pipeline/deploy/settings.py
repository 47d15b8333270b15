"""A deployment: the settings every launch script takes, as this tool's config names them,
read from a run's resolved config (the engines' scripts: pipeline/deploy/hpu.py, gpu.py)."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.config.checkpoint_rules import served_checkpoint
from pipeline.config.engine_profile import engine_name
from pipeline.config.layout import Layout, Pool, layout_of
from stages.forward.bucket_axes import resolve_axes
from stages.forward.buckets import Axis, Bucketing
from stages.forward.engine_grids import (
    FastDeployGrid,
    FastDeploySteps,
    ServerLimits,
    check_fastdeploy_steps,
    fastdeploy_grid,
    fastdeploy_sizes,
    fastdeploy_warmup,
    part_graphs,
)
from stages.simulator.precision import KvCacheDtype, Quantization

AXES = ("prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch", "decode_blocks")


@dataclass(frozen=True)
class Predicted:
    """What the run predicted for this configuration (its metrics.json): the one warmup
    figure every script states, and the shapes it compiled while serving."""

    warmup_graphs: int
    warmup_s: float
    serving_compiles: int
    serving_compile_s: float

    @classmethod
    def of(cls, metrics: Mapping[str, Any] | None) -> Predicted | None:
        if not metrics or metrics.get("warmup_shapes") is None:
            return None
        return cls(
            int(metrics.get("warmup_shapes") or 0), float(metrics.get("predicted_warmup_s") or
            metrics.get("warmup_s") or 0.0), int(metrics.get("serving_compiles") or 0),
            float(metrics.get("serving_compile_s") or 0.0),
        )  # fmt: skip


@dataclass(frozen=True)
class Deployment:
    """The settings both servers take, as this tool's config names them."""

    model: str
    tp: int
    max_tokens: int  # --max-num-batched-tokens
    max_num_seqs: int
    max_model_len: int
    block_size: int
    chunked_prefill: bool  # scheduler=chunked
    prefix_caching: bool
    quantization: Quantization
    kv_cache_dtype: KvCacheDtype
    warmup: bool
    bucketing: Bucketing
    # each bucket axis's prepared sizes (prefill: batch, seq, blocks; decode: batch, blocks)
    buckets: dict[str, list[int]]
    scheduler: str  # the scheduler's class name
    origin: str  # where the configuration came from, as the scripts' first line says it
    align_chunks: bool  # scheduler.align_chunks: non-final chunks cut at whole blocks
    ranges: dict[str, tuple[int, int, int]]  # each axis's min, step, max
    planned: bool  # some axis has explicit sizes (a planned set): no strategy gives them
    fastdeploy: FastDeploySteps  # FastDeploy's warmup environment (metadata.fastdeploy)
    fastdeploy_grid: FastDeployGrid  # the grid FastDeploy's runner warms from it
    fastdeploy_recipes: int  # the recipe sets that grid compiles (step_graphs, whole)
    fastdeploy_parts: int  # its graphs as the run counts them (metadata.step_recipes)
    compile_s: float  # the hardware profile's seconds to compile one graph
    max_prefill_rows: int  # scheduler.max_prefill_rows: prompts a step prefills (0: no cap)
    replicas: int = 1  # copies to start behind a load balancer (a plan's target)
    gpu: bool = False  # a device that computes real tokens (no buckets): the GPU engines
    memory_fraction: float = 0.9  # of a card's memory the server may take
    layout: Layout = field(default_factory=Layout)  # ep, dp, disagg, speculative
    role: str = ""  # a disaggregated pool's server: prefill or decode ("" = aggregated)
    instances: int = 1  # a pool's servers per replica
    engine: str = "native"  # whose step rules and shapes the run simulated (conf/engine/)
    engine_release: str = ""  # its profile's older release ("": the scripts' own)
    predicted: Predicted | None = None  # the run's own figures, where a run was served
    max_warmup_s: float = 0.0  # plan.max_warmup_s: a longer warmup is impractical; 0 = none
    architecture: str = ""  # the model's (its config.json's); "" = not stated
    prequantized: bool = False  # the model is a published FP8 checkpoint: no quantization flag

    def __post_init__(self) -> None:
        # every text a script interpolates, comments included: a newline in a comment
        # starts a line the shell runs
        texts = {"model": self.model, "scheduler": self.scheduler, "origin": self.origin,
                 "role": self.role, "engine.release": self.engine_release}  # fmt: skip
        for name, text in texts.items():
            refuse_control_characters(text, name)


def refuse_control_characters(text: str, what: str) -> str:
    """`text` if it holds no control character (a newline, a carriage return, an escape);
    else a ValueError naming `what`: no id or path a script carries may hold one."""
    bad = next((c for c in text if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(
            f"{what} '{printable(text[:80])}' holds a control character ({bad!r}): a launch "
            "script carries no id or path with one; rename it"
        )
    return text


def printable(text: str) -> str:
    """`text` with each control character as its escape (\\n for a newline): one line."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


def deployment(
    config: Mapping[str, Any],
    num_blocks: int,
    model: str = "",
    *,
    origin: str,
    replicas: int = 1,
    metrics: Mapping[str, Any] | None = None,
) -> Deployment:
    """The deployment a resolved config describes; num_blocks is the KV pool the run had
    (decode buckets are bounded by it); origin: where the config came from (a run folder,
    a plan), said on the scripts' first line; metrics: the run's, whose figures the scripts
    state."""
    scheduler = str(config["scheduler"]["_target_"]).rsplit(".", 1)[-1]
    meta = config["metadata"]
    axes = _run_axes(config, num_blocks)
    strategy = Bucketing(meta.get("bucketing", Bucketing.linear))
    steps = FastDeploySteps(**dict(meta.get("fastdeploy") or {}))
    limits = ServerLimits(
        int(config["block_size"]), int(config["max_tokens"]), int(config["max_num_seqs"]),
        int(config["max_model_len"]), num_blocks, bool(config.get("prefix_caching", True)),
        scheduler == "ChunkedScheduler",
    )  # fmt: skip
    served, fp8 = served_checkpoint(config, model or str(config["model"].get("name") or "MODEL"))
    return Deployment(
        model=refuse_control_characters(served, "the model id"),
        origin=f"{origin}; {fp8}" if fp8 else origin,
        prequantized=bool(fp8),
        architecture=str(config["model"].get("architecture") or ""),
        tp=int(config.get("tp", 1)),
        max_tokens=int(config["max_tokens"]),
        max_num_seqs=int(config["max_num_seqs"]),
        max_model_len=int(config["max_model_len"]),
        block_size=int(config["block_size"]),
        chunked_prefill=scheduler == "ChunkedScheduler",
        prefix_caching=bool(config.get("prefix_caching", True)),
        quantization=Quantization(config.get("quantization", Quantization.none)),
        kv_cache_dtype=KvCacheDtype(config.get("kv_cache_dtype", KvCacheDtype.auto)),
        warmup=bool(config.get("warmup", False)),
        bucketing=strategy,
        buckets=_sizes(strategy, axes, steps, limits),
        scheduler=scheduler,
        align_chunks=bool(config["scheduler"].get("align_chunks", True)),
        **_ranges(axes),
        **_fastdeploy(steps, limits, bool(meta.get("step_recipes", False))),
        replicas=replicas,
        layout=layout_of(config),
        **_simulated(config, metrics),
        **_device(config.get("hardware")),
    )


def _simulated(config: Mapping[str, Any], metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the run simulated: its engine, prompt cap and compile time, and its figures."""
    return {
        "engine": engine_name(config),
        "engine_release": str((config.get("engine") or {}).get("release") or ""),
        "max_prefill_rows": int(config["scheduler"].get("max_prefill_rows") or 0),
        "compile_s": float(config.get("hardware", {}).get("compile_s") or 0.0),
        "predicted": Predicted.of(metrics),
        "max_warmup_s": float((config.get("plan") or {}).get("max_warmup_s") or 0.0),
    }


def _fastdeploy(steps: FastDeploySteps, limits: ServerLimits, whole: bool) -> dict[str, Any]:
    """FastDeploy's warmup environment, the grid its runner warms from it, the recipe sets
    that grid compiles, and its graphs as the run counts them (whole: a mixed step's
    token-wise ops at its own total, as FastDeploy's runner compiles them)."""
    check_fastdeploy_steps(steps, limits.block_size)
    warmup = fastdeploy_warmup(steps, limits)
    return {
        "fastdeploy": steps,
        "fastdeploy_grid": fastdeploy_grid(steps, limits),
        "fastdeploy_recipes": sum(part_graphs(warmup, True).values()),
        "fastdeploy_parts": sum(part_graphs(warmup, whole).values()),
    }


def _run_axes(config: Mapping[str, Any], num_blocks: int) -> dict[str, Axis]:
    """The bucket axes exactly as the run's metadata builder resolved them."""
    return resolve_axes(
        {name: config["metadata"][name] for name in AXES},
        config["block_size"],
        config["max_tokens"],
        config["max_num_seqs"],
        config["max_model_len"],
        num_blocks,
        bool(config.get("prefix_caching", False)),
    )


def _device(hardware: Any) -> dict[str, Any]:
    """A GPU (a profile that does not pad to buckets) and the memory its server may take:
    what the simulated device keeps free (kv_headroom) is what the server leaves."""
    if not isinstance(hardware, Mapping):
        return {}
    return {
        "gpu": not bool(hardware.get("pads_to_buckets", True)),
        "memory_fraction": round(1.0 - float(hardware.get("kv_headroom", 0.1)), 4),
    }


def _ranges(axes: Mapping[str, Any]) -> dict[str, Any]:
    """Each axis's min, step and max, and whether some axis lists planned sizes."""
    return {
        "ranges": {name: (a.min, a.step, a.max) for name, a in axes.items()},
        "planned": any(a.explicit for a in axes.values()),
    }


def _sizes(
    strategy: Bucketing, axes: Mapping[str, Any], steps: FastDeploySteps, limits: ServerLimits
) -> dict[str, list[int]]:
    """Each axis's prepared sizes exactly as the run's metadata builder made them."""
    if strategy is Bucketing.fastdeploy:
        return fastdeploy_sizes(steps, limits, axes["decode_blocks"].max)
    return {name: axis.sizes(strategy) for name, axis in axes.items()}


def pool_deployment(d: Deployment, pool: Pool) -> Deployment:
    """One pool's servers: its tp, dp, ep and limits, the run's speculative settings."""
    inner = replace(d.layout, tp=pool.tp, dp=pool.dp, ep=pool.ep, prefill=0, decode=0,
                    prefill_tp=0, decode_tp=0, prefill_dp=0, decode_dp=0)  # fmt: skip
    return replace(d, tp=pool.tp, max_tokens=pool.max_tokens, max_num_seqs=pool.max_num_seqs,
                   layout=inner, role=pool.role, instances=pool.instances)  # fmt: skip


def replicas_line(d: Deployment, devices_variable: str) -> str:
    """The comment that says how many copies of a script to start (a plan's target), each
    on its cards (pipeline/config/layout.py: tp x dp)."""
    cards = d.layout.cards
    if d.role:
        total = d.instances * d.replicas
        return (
            f"# {d.role} pool: {d.instances} server(s) a replica x {d.replicas} replica(s) = "
            f"{total}. Start {total} copies of this script, each on its own {cards} card(s) "
            f"({devices_variable}) and PORT, all listed in the router's script."
        )
    return (
        f"# replicas: {d.replicas}. Start {d.replicas} copies of this server, each on its own "
        f"{cards} card(s) ({devices_variable}) and port, behind a round-robin balancer."
    )
