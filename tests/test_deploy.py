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

from pipeline.deploy import FASTDEPLOY, OVERRIDES, VLLM, VLLM_BUCKETS, deployment, write_deploy
from pipeline.executors import build_engine
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


# What each server's documentation calls our settings, read back (None: it has none).
# FastDeploy's Intel Gaudi guide: --quantization wint8|wint4, no FP8, no KV-cache dtype.
# vLLM's FP8 INC page: --quantization inc and --kv-cache-dtype fp8_inc; no wint8/wint4.
FASTDEPLOY_READ = {"quantization": {"wint8": "wint8", "wint4": "wint4"}, "kv_cache_dtype": {}}
VLLM_READ = {"quantization": {"inc": "fp8"}, "kv_cache_dtype": {"fp8_inc": "fp8"}}


@pytest.mark.parametrize(
    "overrides",
    [
        ["max_tokens=256", "max_num_seqs=8", "prefix_caching=false"],
        ["scheduler=whole", "max_tokens=512", "metadata.bucketing=exponential", "warmup=true"],
        ["tp=2", "quantization=fp8", "kv_cache_dtype=fp8", "max_tokens=512"],
        ["scheduler=static", "quantization=wint4", "max_tokens=512", "max_num_seqs=4"],
        ["tp=4", "quantization=wint8", "kv_cache_dtype=fp8"],
    ],
    ids=["chunked", "whole", "tp2 fp8", "static wint4", "tp4 wint8"],
)
def test_exported_commands_parse_back_into_the_same_settings(tmp_path, monkeypatch, overrides):
    cfg = make_config(
        ["executor=simulated", "hardware=gaudi3", "model=spec/ernie45_21b_a3b", *overrides]
    )
    engine, _ = build_engine(cfg)
    config = OmegaConf.to_container(cfg, resolve=True)
    d = deployment(config, engine.scheduler.kv_cache.num_blocks, "org/model", origin="a test")
    write_deploy(d, overrides, tmp_path / "deploy")
    chunked = not any(o in overrides for o in ("scheduler=whole", "scheduler=static"))
    monkeypatch.setenv("QUANT_CONFIG", str(tmp_path / "inc.json"))  # an FP8 vLLM deploy needs it
    servers = (
        (FASTDEPLOY, "fastdeploy.entrypoints.openai.api_server", FASTDEPLOY_READ),
        (VLLM, None, VLLM_READ),
    )
    for name, module, read in servers:
        script = (tmp_path / "deploy" / name).read_text()
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
            *prompts, decode = (ast.literal_eval(line) for line in buckets)
            sizes = {k: v.tolist() for k, v in engine.metadata.buckets.sizes.items()}
            # vllm-gaudi's axes (tests/test_deploy_engine.py): per query size, the batches
            # within the token budget and the context blocks, 0 among them
            for batches, query, contexts in prompts:
                assert query in sizes["prefill_seq"] and 0 in contexts
                assert set(batches) <= set(sizes["prefill_batch"])
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
        given = dict(o.split("=", 1) for o in overrides)
        for key, flag, default in (
            ("quantization", flags.quantization, "none"),
            ("kv_cache_dtype", flags.kv_cache_dtype, "auto"),
        ):
            value = given.get(key, default)
            if flag not in (None, "none"):
                assert read[key][flag] == value, (name, key)
            elif value not in ("none", "auto"):  # no counterpart: said, not invented
                assert value not in read[key].values()
                assert f"# {key}={value}: no " in script, (name, key)
        static = "scheduler=static" in overrides
        assert ("no counterpart in this server" in script) == static
    written = (tmp_path / "deploy" / OVERRIDES).read_text().splitlines()
    assert written == overrides
    assert (tmp_path / "deploy" / VLLM_BUCKETS).is_file()


def export(tmp_path: Path, overrides: list[str]) -> tuple[Path, object]:
    cfg = make_config(
        ["executor=simulated", "hardware=gaudi2", "model=spec/ernie45_21b_a3b", *overrides]
    )
    engine, _ = build_engine(cfg)
    config = OmegaConf.to_container(cfg, resolve=True)
    d = deployment(config, engine.scheduler.kv_cache.num_blocks, "m", origin="the run R")
    write_deploy(d, overrides, tmp_path / "deploy")
    return tmp_path / "deploy", engine


def test_fastdeploy_script_exports_its_warmup_grid(tmp_path, capsys):
    steps = {"max_prefill_num": 2, "batch_step_decode": 8, "block_step_decode": 32,
             "warmup_model_len": 2048, "recipe_cache_num": 20}  # fmt: skip
    overrides = ["max_tokens=1024", "scheduler.align_chunks=false", "metadata.bucketing=fastdeploy"]
    overrides += [f"metadata.fastdeploy.{k}={v}" for k, v in steps.items()]
    folder, engine = export(tmp_path, overrides)
    _, env = run_script(folder / FASTDEPLOY, tmp_path)
    names = {"max_prefill_num": "MAX_PREFILL_NUM", "batch_step_decode": "BATCH_STEP_DECODE",
             "block_step_decode": "BLOCK_STEP_DECODE", "warmup_model_len": "HPU_WARMUP_MODEL_LEN",
             "recipe_cache_num": "FLAGS_intel_hpu_recipe_cache_num"}  # fmt: skip
    assert {names[k]: int(env[names[k]]) for k in steps} == {names[k]: v for k, v in steps.items()}
    # the untouched steps: FastDeploy's defaults, the prefill step its block size (SMALL's 16)
    assert (env["BATCH_STEP_PREFILL"], env["SEQUENCE_STEP_PREFILL"]) == ("1", "16")
    assert env["CONTEXT_BLOCK_STEP_PREFILL"] == "1"
    script = (folder / FASTDEPLOY).read_text()
    # the grid's forward passes, as the run's warmup listed FastDeploy's runs
    runs = sum(len(v) for v in engine.warmup_shapes().values())
    assert f"warmup grid from these: {runs:,} forward passes" in script
    if engine.warmup_shapes()["mixed"]:  # the device's own count, the run's warmup_shapes
        assert f"counts {sum(engine.warmup_counts().values()):,} graphs" in script
    assert runs > 20 and "WARNING" in script and "WARNING" in capsys.readouterr().err
    assert "simulate it with engine=fastdeploy" in script  # a native run: not FastDeploy's cap
    for name in (FASTDEPLOY, VLLM):
        text = (folder / name).read_text()
        assert "scheduler.align_chunks=false" in text
        assert "the run R" in text and "pipeline.plan" not in text


def test_vllm_script_exports_its_own_strategy(tmp_path):
    folder, engine = export(tmp_path, ["max_tokens=1024", "metadata.bucketing=vllm_lin"])
    _, env = run_script(folder / VLLM, tmp_path)
    assert env["VLLM_BUCKETING_STRATEGY"] == "lin" and "VLLM_BUCKETING_FROM_FILE" not in env
    axis = engine.metadata.buckets.axes["decode_batch"]
    assert (env["VLLM_DECODE_BS_BUCKET_MIN"], env["VLLM_DECODE_BS_BUCKET_STEP"]) == (
        str(axis.min), str(axis.step))  # fmt: skip
    # the default recipe cache is unset: no flag, no warning
    assert "FLAGS_intel_hpu_recipe_cache_num" not in (folder / FASTDEPLOY).read_text()
