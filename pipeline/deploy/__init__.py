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
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.command import ArgparseCommand, Failure
from pipeline.deploy.consistency import NATIVE
from pipeline.deploy.hpu import FASTDEPLOY, VLLM, VLLM_BUCKETS, fastdeploy_warnings, hpu_scripts
from pipeline.deploy.settings import Deployment, deployment, printable, refuse_control_characters
from pipeline.run_folder.reader import (
    METRICS,
    RESOLVED_CONFIG,
    read_mapping,
    read_metrics,
    read_overrides,
)
from pipeline.run_folder.run_files import RunFileError, RunFolderError, output_folder, write_file

OVERRIDES = "overrides.txt"
__all__ = ["COMMAND", "FASTDEPLOY", "OVERRIDES", "VLLM", "VLLM_BUCKETS", "Deployment", "deployment",
           "export_run", "main", "tool_overrides", "write_deploy"]  # fmt: skip


def tool_overrides(overrides: Sequence[str], config: Mapping[str, Any]) -> list[str]:
    """The overrides that give `python -m pipeline` this configuration: the plan's own
    defaults (the simulated device, warmup) first, where the overrides do not set them."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    implied = [("executor", "simulated"), ("warmup", str(bool(config.get("warmup"))).lower())]
    return [f"{k}={v}" for k, v in implied if k not in keys] + list(overrides)


NATIVE_WARNING = (
    "engine=native: the run simulated this tool's own scheduler and bucket grids; the "
    "scripts written are the deployed engines' (FastDeploy, vLLM, SGLang, TensorRT-LLM), "
    "none of which it simulated, and each says so: run with engine=fastdeploy (or vllm, "
    "sglang, trtllm) to predict the engine you deploy"
)


def write_deploy(d: Deployment, overrides: Sequence[str], out: Path) -> list[Path]:
    """Writes the deploy files of the run's engine (engine=native: every engine's, none of
    them simulated, which it says) for the device: on a GPU the GPU engines' scripts
    (pipeline/deploy/gpu.py), on Gaudi FastDeploy's and vllm-gaudi's (and the bucket file
    the vLLM script reads); this tool's overrides in either case."""
    for override in overrides:  # one a line: a newline would split one into two
        refuse_control_characters(override, "the override")
    write_file(output_folder(out) / OVERRIDES, "".join(f"{o}\n" for o in overrides))
    if d.engine == NATIVE:
        print(NATIVE_WARNING, file=sys.stderr)
    if d.gpu:
        from pipeline.deploy.gpu import write_gpu_deploy

        return [*write_gpu_deploy(d, out), out / OVERRIDES]
    files = hpu_scripts(d)
    for warning in fastdeploy_warnings(d):
        print(warning, file=sys.stderr)
    for name, text in files.items():
        write_file(out / name, text, executable=name.endswith(".sh"))
    return [out / name for name in files] + [out / OVERRIDES]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.deploy",
        description="Write the launch scripts for one run or plan job folder: on a GPU "
        "vllm-cuda.sh, sglang.sh, trtllm.sh, fastdeploy-gpu.sh; on Gaudi fastdeploy-hpu.sh, "
        "vllm-gaudi.sh; overrides.txt. A disaggregated configuration (disagg.prefill > 0) "
        "gets ENGINE-prefill.sh, ENGINE-decode.sh and ENGINE-router.sh instead. A run of "
        "engine=fastdeploy (vllm, ...) gets that engine's scripts only. Example: "
        "python -m pipeline.deploy outputs/plan/X/3",
    )
    parser.add_argument("run_dir", type=Path, help="a run or plan job folder")
    parser.add_argument("--out", type=Path, help="where to write (default RUN_DIR/deploy)")
    parser.add_argument(
        "--model",
        default="",
        help="the model id or folder the servers load (default: a plan job's plan.model_id)",
    )
    return parser


def export_command(args: argparse.Namespace, argv: list[str]) -> int:
    written = export_run(args.run_dir, args.out or args.run_dir / "deploy", args.model)
    print("\n".join(str(p) for p in written))
    return 0


def cannot_export(err: Exception, args: argparse.Namespace) -> str:
    return f"{printable(str(args.run_dir))}: cannot export ({err})"


COMMAND = ArgparseCommand(
    name="pipeline.deploy",
    parser=build_parser,
    run=export_command,
    failures=(
        Failure((OSError, ValueError, KeyError, RunFileError, RunFolderError), 2, cannot_export),
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    return COMMAND.main(argv)


def export_run(run_dir: Path, out: Path, model: str = "") -> list[Path]:
    """The deploy files of a run folder, from its resolved config and metrics.json, each
    read by the run folder's checked reader."""
    refuse_control_characters(str(run_dir), "the run folder's path")
    config = read_mapping(run_dir / RESOLVED_CONFIG)
    metrics = read_metrics(run_dir)
    if metrics is None:
        raise RunFileError(f"{run_dir} has no {METRICS}: give a run or plan job folder")
    num_blocks = positive_count(metrics.get("num_blocks") or config.get("num_blocks"))
    if num_blocks < 1:
        raise ValueError("metrics.json has no num_blocks (run it again with this version)")
    origin = f"the configuration of the run {shlex.quote(str(run_dir))}"
    plan = config.get("plan")  # a plan job records the model id its deployment loads
    recorded = str(plan.get("model_id") or "") if isinstance(plan, dict) else ""
    try:
        d = deployment(config, num_blocks, model or recorded, origin=origin, metrics=metrics)
    except (TypeError, AttributeError, KeyError) as err:  # a field missing or of another kind
        raise RunFileError(
            f"{run_dir / RESOLVED_CONFIG} is not a config the pipeline wrote "
            f"({' '.join(str(err).split())[:200]}): restore the file the run wrote"
        ) from err
    return write_deploy(d, read_overrides(run_dir) or [], out)


def positive_count(value: object) -> int:
    """A count read from a run's file: an integer (not a bool), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
