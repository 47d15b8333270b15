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
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stages.buckets import Bucketing
from stages.simulator.precision import KvCacheDtype, Quantization

FASTDEPLOY, VLLM, OVERRIDES, VLLM_BUCKETS = (
    "fastdeploy-hpu.sh",
    "vllm-gaudi.sh",
    "overrides.txt",
    "vllm-buckets.txt",
)
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
    replicas: int = 1  # copies to start behind a load balancer (a plan's target)
    gpu: bool = False  # a device that computes real tokens (no buckets): the GPU engines
    memory_fraction: float = 0.9  # of a card's memory the server may take


def deployment(
    config: Mapping[str, Any], num_blocks: int, model: str = "", replicas: int = 1
) -> Deployment:
    """The deployment a resolved config describes; num_blocks is the KV pool the run had
    (decode buckets are bounded by it)."""
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
        buckets={name: axis.sizes(strategy) for name, axis in axes.items()},
        scheduler=scheduler,
        replicas=replicas,
        **_device(config.get("hardware")),
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


def _lines(parts: Sequence[str]) -> str:
    return " \\\n  ".join(parts)


# quantization and kv_cache_dtype as each server names them. FastDeploy's Intel Gaudi
# guide takes weight-only wint8/wint4 and no FP8 or KV-cache dtype. vllm-gaudi runs FP8
# through Intel Neural Compressor (vLLM's "FP8 INC" page): `--quantization inc` with the
# model's calibrated QUANT_CONFIG, and `--kv-cache-dtype fp8_inc`; it has no wint8/wint4.
FASTDEPLOY_QUANTIZATION = {"wint8": "wint8", "wint4": "wint4"}
VLLM_QUANTIZATION = {"fp8": "inc"}
VLLM_KV_CACHE_DTYPE = {"fp8": "fp8_inc"}


def _header(d: Deployment, server: str, note: str) -> list[str]:
    lines = [
        "#!/usr/bin/env bash",
        f"# {server}: {d.model}, as planned by python -m pipeline.plan.",
        f"# {note}",
        "set -euo pipefail",
    ]
    if d.scheduler not in ("ChunkedScheduler", "WholeScheduler"):
        # Static batching (scheduler=static) waits for a whole batch to end before admitting
        # more; both servers batch continuously and have no setting for it.
        lines.append(
            f"# scheduler {d.scheduler}: no counterpart in this server (it batches "
            "continuously); the plan's figures for it do not carry over."
        )
    return lines


def fastdeploy_script(d: Deployment) -> str:
    """FastDeploy's OpenAI server on Intel HPU with the planned limits."""
    lines = _header(
        d, "FastDeploy on Intel Gaudi", "--model: the Paddle checkpoint (folder or id)."
    )
    lines += [
        "export FD_ATTENTION_BACKEND=HPU_ATTN",
        f"export HPU_WARMUP_BUCKET={1 if d.warmup else 0}",
        f"export HPU_WARMUP_MODEL_LEN={d.max_model_len}",
        "export PADDLE_DISTRI_BACKEND=xccl",
        "export PADDLE_XCCL_BACKEND=intel_hpu",
        "# Bucket sets: FastDeploy's HPU runner derives its own; the simulated ones are in",
        f"# {VLLM_BUCKETS} (no FastDeploy setting takes them).",
    ]
    args = [
        "exec python -m fastdeploy.entrypoints.openai.api_server",
        f"--model {shlex.quote(d.model)}",
        f"--tensor-parallel-size {d.tp}",
        f"--max-model-len {d.max_model_len}",
        f"--max-num-seqs {d.max_num_seqs}",
        f"--block-size {d.block_size}",
        f"--max-num-batched-tokens {d.max_tokens}",
    ]
    if d.chunked_prefill:
        args.append("--enable-chunked-prefill")
    args.append("--enable-prefix-caching" if d.prefix_caching else "--no-enable-prefix-caching")
    if d.quantization in FASTDEPLOY_QUANTIZATION:
        args.append(f"--quantization {FASTDEPLOY_QUANTIZATION[d.quantization]}")
    elif d.quantization != Quantization.none:
        lines.append(f"# quantization={d.quantization}: no FastDeploy HPU counterpart; not set.")
    if d.kv_cache_dtype != KvCacheDtype.auto:
        lines.append(f"# kv_cache_dtype={d.kv_cache_dtype}: no FastDeploy HPU setting; not set.")
    args.append("--graph-optimization-config '{\"use_cudagraph\":false}'")
    return "\n".join([*lines, _lines(args)]) + "\n"


def _range_env(phase: str, dim: str, sizes: list[int]) -> list[str]:
    step = sizes[1] - sizes[0] if len(sizes) > 1 else 1
    return [
        f"# export VLLM_{phase}_{dim}_BUCKET_{key}={value}"
        for key, value in (("MIN", sizes[0]), ("STEP", step), ("MAX", sizes[-1]))
    ]


def vllm_buckets_file(d: Deployment) -> str:
    """VLLM_BUCKETING_FROM_FILE's format: one product of lists per line; prompt buckets
    (batch, query tokens, context blocks), decode buckets (batch, 1, blocks)."""
    b = d.buckets
    return (
        f"({b['prefill_batch']}, {b['prefill_seq']}, {b['prefill_blocks']})\n"
        f"({b['decode_batch']}, 1, {b['decode_blocks']})\n"
    )


def vllm_script(d: Deployment) -> str:
    """`vllm serve` on vllm-gaudi with the planned limits and the simulated bucket sets."""
    lines = _header(
        d, "vLLM on Intel Gaudi (vllm-gaudi)", "The model: a Hugging Face id or folder."
    )
    exponential = d.bucketing == Bucketing.exponential
    lines += [
        "# The bucket sets the simulation prepared, exactly, from the file beside this one:",
        "# prompt (batch, query tokens, blocks), decode (batch, 1, blocks of all rows). The",
        "# prompt's third axis here counts the chunk's blocks with its context's.",
        'export VLLM_BUCKETING_FROM_FILE="$(dirname "$0")/' + VLLM_BUCKETS + '"',
        f"export VLLM_SKIP_WARMUP={'false' if d.warmup else 'true'}",
        "# Without file support, these ranges come closest; vLLM's linear ranges double from",
        "# MIN up to STEP first, so they are not the same sets. VLLM_EXPONENTIAL_BUCKETING is",
        "# deprecated (it overrides VLLM_BUCKETING_STRATEGY) and is left unset.",
        f"# export VLLM_BUCKETING_STRATEGY={'exp' if exponential else 'lin'}",
    ]
    b = d.buckets
    lines += _range_env("PROMPT", "BS", b["prefill_batch"])
    lines += _range_env("PROMPT", "QUERY", b["prefill_seq"])
    lines += _range_env("PROMPT", "CTX", b["prefill_blocks"])
    lines += _range_env("DECODE", "BS", b["decode_batch"])
    lines += _range_env("DECODE", "BLOCK", b["decode_blocks"])
    args = [
        f"exec vllm serve {shlex.quote(d.model)}",
        f"--tensor-parallel-size {d.tp}",
        f"--max-model-len {d.max_model_len}",
        f"--max-num-seqs {d.max_num_seqs}",
        f"--block-size {d.block_size}",
        f"--max-num-batched-tokens {d.max_tokens}",
        "--enable-chunked-prefill" if d.chunked_prefill else "--no-enable-chunked-prefill",
        "--enable-prefix-caching" if d.prefix_caching else "--no-enable-prefix-caching",
    ]
    if d.quantization in VLLM_QUANTIZATION:
        args.append(f"--quantization {VLLM_QUANTIZATION[d.quantization]}")
        lines += [
            "# FP8 through Intel Neural Compressor needs the model's measurements: QUANT_CONFIG",
            "# names the quantization JSON that calibration wrote (vLLM's FP8 INC page).",
            ': "${QUANT_CONFIG:?set QUANT_CONFIG to the INC quantization JSON of the model}"',
        ]
    elif d.quantization != Quantization.none:
        lines.append(f"# quantization={d.quantization}: no vllm-gaudi counterpart; not set.")
    if d.kv_cache_dtype in VLLM_KV_CACHE_DTYPE:
        args.append(f"--kv-cache-dtype {VLLM_KV_CACHE_DTYPE[d.kv_cache_dtype]}")
    elif d.kv_cache_dtype != KvCacheDtype.auto:
        lines.append(f"# kv_cache_dtype={d.kv_cache_dtype}: no vllm-gaudi counterpart; not set.")
    return "\n".join([*lines, _lines(args)]) + "\n"


def tool_overrides(overrides: Sequence[str], config: Mapping[str, Any]) -> list[str]:
    """The overrides that give `python -m pipeline` this configuration: the plan's own
    defaults (the simulated device, warmup) first, where the overrides do not set them."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    implied = [("executor", "simulated"), ("warmup", str(bool(config.get("warmup"))).lower())]
    return [f"{k}={v}" for k, v in implied if k not in keys] + list(overrides)


def write_deploy(d: Deployment, overrides: Sequence[str], out: Path) -> list[Path]:
    """Writes the deploy files for the device: on a GPU the GPU engines' scripts
    (pipeline/deploy/gpu.py), on Gaudi FastDeploy's and vllm-gaudi's (and the bucket file
    the vLLM script reads); this tool's overrides in either case."""
    out.mkdir(parents=True, exist_ok=True)
    (out / OVERRIDES).write_text("".join(f"{o}\n" for o in overrides), encoding="utf-8")
    if d.gpu:
        from pipeline.deploy.gpu import write_gpu_deploy

        return [*write_gpu_deploy(d, out), out / OVERRIDES]
    files = {
        FASTDEPLOY: fastdeploy_script(d),
        VLLM: vllm_script(d),
        VLLM_BUCKETS: vllm_buckets_file(d),
    }
    for name, text in files.items():
        if name.endswith(".sh"):  # after the shebang: how many copies to start
            head, _, rest = text.partition("\n")
            text = f"{head}\n{replicas_line(d, 'HPU_VISIBLE_DEVICES')}\n{rest}"
        (out / name).write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            (out / name).chmod(0o755)
    return [out / name for name in files] + [out / OVERRIDES]


def replicas_line(d: Deployment, devices_variable: str) -> str:
    """The comment that says how many copies of a script to start (a plan's target)."""
    return (
        f"# replicas: {d.replicas}. Start {d.replicas} copies of this server, each on its own "
        f"{d.tp} card(s) ({devices_variable}) and port, behind a round-robin balancer."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.deploy",
        description="Write the launch scripts for one run or plan job folder: on a GPU "
        "vllm-cuda.sh, sglang.sh, trtllm.sh, fastdeploy-gpu.sh; on Gaudi fastdeploy-hpu.sh, "
        "vllm-gaudi.sh; overrides.txt. Example: python -m pipeline.deploy outputs/plan/X/3",
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
    return write_deploy(deployment(config, num_blocks, model), overrides or [], out)
