"""Deploy export: the scripts, run by bash with stand-ins for the servers, pass the same
settings the plan's configuration has, and the bucket file holds the buckets the engine built."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.build import build_engine
from pipeline.deploy import FASTDEPLOY, OVERRIDES, VLLM, VLLM_BUCKETS, deployment, write_deploy
from tests.helpers import make_config

STAND_IN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$CAPTURE/args"
env > "$CAPTURE/env"
"""


def run_script(script: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """What the script would start: the server's arguments and its environment."""
    bin_dir, capture = tmp_path / "bin", tmp_path / "capture"
    bin_dir.mkdir(exist_ok=True)
    capture.mkdir(exist_ok=True)
    for name in ("python", "vllm"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CAPTURE": str(capture)}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    args = (capture / "args").read_text().splitlines()
    environ = dict(
        line.split("=", 1) for line in (capture / "env").read_text().splitlines() if "=" in line
    )
    return args, environ


def server_flags(args: list[str]) -> argparse.Namespace:
    """Both servers' flags as their documentation names them (a parser of our own)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    for flag in ("--tensor-parallel-size", "--max-model-len", "--max-num-seqs", "--block-size",
                 "--max-num-batched-tokens"):  # fmt: skip
        parser.add_argument(flag, type=int)
    for flag in ("chunked-prefill", "prefix-caching"):
        parser.add_argument(f"--enable-{flag}", dest=flag.replace("-", "_"), action="store_true")
        parser.add_argument(
            f"--no-enable-{flag}", dest=flag.replace("-", "_"), action="store_false"
        )
    parser.set_defaults(chunked_prefill=False, prefix_caching=None)  # absent: off, unsaid
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--kv-cache-dtype")
    parser.add_argument("--graph-optimization-config")
    return parser.parse_args(args)


@pytest.mark.parametrize(
    "overrides",
    [
        ["max_tokens=256", "max_num_seqs=8", "prefix_caching=false"],
        ["scheduler=whole", "max_tokens=512", "metadata.bucketing=exponential", "warmup=true"],
    ],
    ids=["chunked", "whole"],
)
def test_exported_commands_parse_back_into_the_same_settings(tmp_path, overrides):
    cfg = make_config(
        ["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b", *overrides]
    )
    engine, _ = build_engine(cfg)
    config = OmegaConf.to_container(cfg, resolve=True)
    d = deployment(config, engine.scheduler.kv_cache.num_blocks, "org/model")
    write_deploy(d, overrides, tmp_path / "deploy")
    chunked = "scheduler=whole" not in overrides
    for name, module in ((FASTDEPLOY, "fastdeploy.entrypoints.openai.api_server"), (VLLM, None)):
        args, env = run_script(tmp_path / "deploy" / name, tmp_path)
        if module:
            assert args[:2] == ["-m", module]
            args = args[2:]
            assert env["HPU_WARMUP_BUCKET"] == ("1" if cfg.warmup else "0")
            assert env["FD_ATTENTION_BACKEND"] == "HPU_ATTN"
        else:
            assert args[0] == "serve"
            args = ["--model", args[1], *args[2:]]
            assert env["VLLM_SKIP_WARMUP"] == ("false" if cfg.warmup else "true")
            buckets = Path(env["VLLM_BUCKETING_FROM_FILE"]).read_text().splitlines()
            prompt, decode = (ast.literal_eval(line) for line in buckets)
            sizes = {k: v.tolist() for k, v in engine.metadata.buckets.sizes.items()}
            assert list(prompt) == [
                sizes["prefill_batch"],
                sizes["prefill_seq"],
                sizes["prefill_blocks"],
            ]
            assert list(decode) == [sizes["decode_batch"], 1, sizes["decode_blocks"]]
        flags = server_flags(args)
        assert flags.model == "org/model"
        assert flags.tensor_parallel_size == cfg.tp
        assert flags.max_model_len == cfg.max_model_len
        assert flags.max_num_seqs == cfg.max_num_seqs
        assert flags.block_size == cfg.block_size
        assert flags.max_num_batched_tokens == cfg.max_tokens
        assert flags.prefix_caching == cfg.prefix_caching
        assert flags.chunked_prefill == chunked
        assert flags.quantization == "none"
    written = (tmp_path / "deploy" / OVERRIDES).read_text().splitlines()
    assert written == overrides
    assert (tmp_path / "deploy" / VLLM_BUCKETS).is_file()
