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
from pathlib import Path
from typing import Any

import yaml

from pipeline.deploy.hpu import FASTDEPLOY, VLLM, VLLM_BUCKETS, fastdeploy_warnings, hpu_scripts
from pipeline.deploy.settings import Deployment, deployment

OVERRIDES = "overrides.txt"
__all__ = ["FASTDEPLOY", "OVERRIDES", "VLLM", "VLLM_BUCKETS", "Deployment", "deployment",
           "export_run", "main", "tool_overrides", "write_deploy"]  # fmt: skip


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
    files = hpu_scripts(d)
    for warning in fastdeploy_warnings(d):
        print(warning, file=sys.stderr)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            (out / name).chmod(0o755)
    return [out / name for name in files] + [out / OVERRIDES]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.deploy",
        description="Write the launch scripts for one run or plan job folder: on a GPU "
        "vllm-cuda.sh, sglang.sh, trtllm.sh, fastdeploy-gpu.sh; on Gaudi fastdeploy-hpu.sh, "
        "vllm-gaudi.sh; overrides.txt. A disaggregated configuration (disagg.prefill > 0) "
        "gets ENGINE-prefill.sh, ENGINE-decode.sh and ENGINE-router.sh instead. Example: "
        "python -m pipeline.deploy outputs/plan/X/3",
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
