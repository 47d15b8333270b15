"""The command lines that deploy a planned configuration: FastDeploy's OpenAI server on
Intel Gaudi, vLLM with the vllm-gaudi plugin, and this tool's own overrides.

    python -m pipeline.deploy RUN_DIR [--out DIR] [--model NAME]

Names and meanings follow the projects' documentation: FastDeploy's Intel Gaudi guide
(docs/get_started/installation/intel_gaudi.md) and vllm-gaudi's bucketing and environment
pages (docs/features/bucketing_mechanism.md, docs/configuration/env_variables.md). A setting
with no counterpart there is said in a comment, not invented.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.deploy.hpu import (
    VLLM_BUCKETS,
    fastdeploy_script,
    fastdeploy_warnings,
    vllm_buckets_file,
    vllm_script,
)
from stages.buckets import Bucketing
from stages.engine_grids import (
    FastDeployGrid,
    FastDeploySteps,
    ServerLimits,
    fastdeploy_grid,
    fastdeploy_sizes,
    fastdeploy_warmup,
    part_graphs,
)
from stages.simulator.precision import KvCacheDtype, Quantization

FASTDEPLOY, VLLM, OVERRIDES = "fastdeploy-hpu.sh", "vllm-gaudi.sh", "overrides.txt"
AXES = ("prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch", "decode_blocks")


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
    fastdeploy: FastDeploySteps  # FastDeploy's warmup environment (metadata.fastdeploy)
    fastdeploy_grid: FastDeployGrid  # the grid FastDeploy's runner warms from it
    fastdeploy_parts: int  # its graphs as the simulated device counts them (parts apart)
    compile_s: float  # the hardware profile's seconds to compile one graph
    max_prefill_rows: int  # scheduler.max_prefill_rows: prompts a step prefills (0: no cap)


def deployment(
    config: Mapping[str, Any], num_blocks: int, model: str = "", *, origin: str
) -> Deployment:
    """The deployment a resolved config describes; num_blocks is the KV pool the run had
    (decode buckets are bounded by it); origin: where the config came from (a run folder,
    a plan), said on the scripts' first line."""
    from stages.bucket_axes import resolve_axes  # the bucket sets exactly as the run built them

    scheduler = str(config["scheduler"]["_target_"]).rsplit(".", 1)[-1]
    meta = config["metadata"]
    axes = resolve_axes(
        {name: meta[name] for name in AXES},
        config["block_size"],
        config["max_tokens"],
        config["max_num_seqs"],
        config["max_model_len"],
        num_blocks,
        bool(config.get("prefix_caching", False)),
    )
    strategy = Bucketing(meta.get("bucketing", Bucketing.linear))
    steps = FastDeploySteps(**dict(meta.get("fastdeploy") or {}))
    limits = ServerLimits(
        int(config["block_size"]), int(config["max_tokens"]), int(config["max_num_seqs"]),
        int(config["max_model_len"]), num_blocks, bool(config.get("prefix_caching", True)),
        scheduler == "ChunkedScheduler",
    )  # fmt: skip
    return Deployment(
        model=model or str(config["model"].get("name") or "MODEL"),
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
        origin=origin,
        align_chunks=bool(config["scheduler"].get("align_chunks", True)),
        ranges={name: (a.min, a.step, a.max) for name, a in axes.items()},
        fastdeploy=steps,
        fastdeploy_grid=fastdeploy_grid(steps, limits),
        fastdeploy_parts=sum(part_graphs(fastdeploy_warmup(steps, limits)).values()),
        compile_s=float(config.get("hardware", {}).get("compile_s") or 0.0),
        max_prefill_rows=int(config["scheduler"].get("max_prefill_rows") or 0),
    )


def _sizes(
    strategy: Bucketing, axes: Mapping[str, Any], steps: FastDeploySteps, limits: ServerLimits
) -> dict[str, list[int]]:
    """Each axis's prepared sizes exactly as the run's metadata builder made them."""
    if strategy is Bucketing.fastdeploy:
        return fastdeploy_sizes(steps, limits, axes["decode_blocks"].max)
    return {name: axis.sizes(strategy) for name, axis in axes.items()}


def tool_overrides(overrides: Sequence[str], config: Mapping[str, Any]) -> list[str]:
    """The overrides that give `python -m pipeline` this configuration: the plan's own
    defaults (the simulated device, warmup) first, where the overrides do not set them."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    implied = [("executor", "simulated"), ("warmup", str(bool(config.get("warmup"))).lower())]
    return [f"{k}={v}" for k, v in implied if k not in keys] + list(overrides)


def write_deploy(d: Deployment, overrides: Sequence[str], out: Path) -> list[Path]:
    """Writes the three deploy files (and the bucket file the vLLM script reads)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        FASTDEPLOY: fastdeploy_script(d),
        VLLM: vllm_script(d),
        VLLM_BUCKETS: vllm_buckets_file(d),
        OVERRIDES: "".join(f"{o}\n" for o in overrides),  # python -m pipeline $(cat ...)
    }
    for warning in fastdeploy_warnings(d):
        print(warning, file=sys.stderr)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            (out / name).chmod(0o755)
    return [out / name for name in files]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.deploy",
        description="Write deploy/{fastdeploy-hpu.sh,vllm-gaudi.sh,overrides.txt} for one run "
        "or plan job folder. Example: python -m pipeline.deploy outputs/plan/X/3",
    )
    parser.add_argument("run_dir", type=Path, help="a run or plan job folder")
    parser.add_argument("--out", type=Path, help="where to write (default RUN_DIR/deploy)")
    parser.add_argument("--model", default="", help="the model id or folder the servers load")
    args = parser.parse_args(argv)
    try:
        written = export_run(args.run_dir, args.out or args.run_dir / "deploy", args.model)
    except (OSError, ValueError, KeyError) as err:
        print(f"Error: {args.run_dir}: cannot export ({err})", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    return 0


def export_run(run_dir: Path, out: Path, model: str = "") -> list[Path]:
    """The deploy files of a run folder, from its resolved config and metrics.json."""
    config = yaml.safe_load((run_dir / "resolved_config.yaml").read_text(encoding="utf-8"))
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    overrides_path = run_dir / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.is_file() else []
    num_blocks = int(metrics.get("num_blocks") or config.get("num_blocks") or 0)
    if num_blocks < 1:
        raise ValueError("metrics.json has no num_blocks (run it again with this version)")
    d = deployment(config, num_blocks, model, origin=f"the configuration of the run {run_dir}")
    return write_deploy(d, overrides or [], out)
