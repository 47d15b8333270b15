"""GPU launch scripts: each parses back (shlex, and trtllm-serve's YAML) to the settings it
came from, under each engine's own names as written here by hand from its documentation; a
setting an engine cannot express is a comment; no HPU variable; replicas said."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.deploy import deployment, write_deploy
from tests.helpers import make_config

BASE = ["executor=simulated", "hardware=h100", "model=spec/qwen25_7b", "max_model_len=4096",
        "max_num_seqs=64", "max_tokens=2048", "block_size=32"]  # fmt: skip


def parse(script: str) -> tuple[list[str], dict[str, str | bool]]:
    """The command and its flags: `--flag value` pairs, bare `--flag` as True."""
    body = script.split("\nexec ", 1)[1].replace("\\\n", " ")
    tokens = shlex.split(body, comments=True)
    words = tokens[: next(i for i, t in enumerate(tokens) if t.startswith("--"))]
    flags: dict[str, str | bool] = {}
    rest = tokens[len(words) :]
    i = 0
    while i < len(rest):
        value = i + 1 < len(rest) and not rest[i + 1].startswith("--")
        flags[rest[i]] = rest[i + 1] if value else True
        i += 2 if value else 1
    return words, flags


def scripts(tmp_path: Path, overrides: list[str], replicas: int = 3) -> Path:
    cfg = make_config([*BASE, *overrides])
    config = yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))
    out = tmp_path / "deploy"
    d = deployment(config, 1000, "org/m", origin="a test", replicas=replicas)
    write_deploy(d, ["tp=2"], out)
    return out


def test_every_setting_under_each_engines_own_name(tmp_path):
    out = scripts(tmp_path, ["tp=2", "quantization=fp8", "kv_cache_dtype=fp8"])
    assert sorted(p.name for p in out.iterdir()) == [
        "fastdeploy-gpu.sh", "overrides.txt", "sglang.sh", "trtllm-options.yaml", "trtllm.sh",
        "vllm-cuda.sh",
    ]  # fmt: skip
    words, vllm = parse((out / "vllm-cuda.sh").read_text())
    assert words == ["vllm", "serve", "org/m"]
    assert vllm == {"--tensor-parallel-size": "2", "--max-num-seqs": "64",
                    "--max-num-batched-tokens": "2048", "--max-model-len": "4096",
                    "--block-size": "32", "--enable-chunked-prefill": True,
                    "--enable-prefix-caching": True, "--quantization": "fp8",
                    "--kv-cache-dtype": "fp8", "--gpu-memory-utilization": "0.9"}  # fmt: skip
    words, sglang = parse((out / "sglang.sh").read_text())
    assert words == ["python", "-m", "sglang.launch_server"]
    assert sglang == {"--model-path": "org/m", "--tp-size": "2", "--max-running-requests": "64",
                      "--max-prefill-tokens": "2048", "--context-length": "4096",
                      "--page-size": "32", "--chunked-prefill-size": "2048",
                      "--quantization": "fp8", "--kv-cache-dtype": "fp8_e4m3",
                      "--mem-fraction-static": "0.9"}  # fmt: skip
    words, trt = parse((out / "trtllm.sh").read_text())
    assert words == ["trtllm-serve", "org/m"]
    assert trt == {"--tp_size": "2", "--max_batch_size": "64", "--max_num_tokens": "2048",
                   "--max_seq_len": "4096", "--kv_cache_free_gpu_memory_fraction": "0.9",
                   "--extra_llm_api_options": "$(dirname $0)/trtllm-options.yaml"}  # fmt: skip
    options = yaml.safe_load((out / "trtllm-options.yaml").read_text())
    assert options == {"enable_chunked_prefill": True, "kv_cache_config": {
        "tokens_per_block": 32, "enable_block_reuse": True, "dtype": "fp8"}}  # fmt: skip
    assert "quantization=fp8: not set" in (out / "trtllm.sh").read_text()
    words, fd = parse((out / "fastdeploy-gpu.sh").read_text())
    assert fd == {"--model": "org/m", "--tensor-parallel-size": "2", "--max-num-seqs": "64",
                  "--max-num-batched-tokens": "2048", "--max-model-len": "4096",
                  "--block-size": "32", "--enable-chunked-prefill": True,
                  "--enable-prefix-caching": True, "--quantization": "block_wise_fp8",
                  "--gpu-memory-utilization": "0.9"}  # fmt: skip
    assert "kv_cache_dtype=fp8: not set" in (out / "fastdeploy-gpu.sh").read_text()


def test_settings_turned_off_and_ones_an_engine_lacks(tmp_path):
    out = scripts(tmp_path, ["scheduler=whole", "prefix_caching=false", "quantization=wint8"])
    _, vllm = parse((out / "vllm-cuda.sh").read_text())
    assert vllm["--no-enable-chunked-prefill"] is True
    assert vllm["--no-enable-prefix-caching"] is True and "--quantization" not in vllm
    assert "quantization=wint8: not set" in (out / "vllm-cuda.sh").read_text()
    _, sglang = parse((out / "sglang.sh").read_text())
    assert sglang["--chunked-prefill-size"] == "-1" and sglang["--disable-radix-cache"] is True
    options = yaml.safe_load((out / "trtllm-options.yaml").read_text())
    kv = {"tokens_per_block": 32, "enable_block_reuse": False}
    assert options == {"enable_chunked_prefill": False, "kv_cache_config": kv}
    _, fd = parse((out / "fastdeploy-gpu.sh").read_text())
    assert fd["--quantization"] == "wint8"
    assert "--enable-chunked-prefill" not in fd and "--enable-prefix-caching" not in fd


@pytest.mark.parametrize("name", ["vllm-cuda.sh", "sglang.sh", "trtllm.sh", "fastdeploy-gpu.sh"])
def test_no_hpu_variable_and_the_replicas_said(tmp_path, name):
    text = (scripts(tmp_path, [], replicas=4) / name).read_text()
    assert not re.search(r"HPU|VLLM_BUCKETING|QUANT_CONFIG|PADDLE_XCCL|FD_ATTENTION", text)
    assert "export " not in text
    assert "replicas: 4. Start 4 copies" in text


def test_a_gaudi_plan_keeps_its_own_scripts(tmp_path):
    ernie = "model=spec/ernie45_21b_a3b"  # FastDeploy on Gaudi: the ERNIE 4.5 series
    cfg = make_config([*BASE[:1], "hardware=gaudi3", ernie, *BASE[3:]])
    config = yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))
    d = deployment(config, 1000, "org/m", origin="a test", replicas=5)
    written = write_deploy(d, [], tmp_path)
    assert sorted(p.name for p in written) == [
        "fastdeploy-hpu.sh", "overrides.txt", "vllm-buckets.txt", "vllm-gaudi.sh"]  # fmt: skip
    for name in ("fastdeploy-hpu.sh", "vllm-gaudi.sh"):
        lines = (tmp_path / name).read_text().splitlines()
        assert lines[0] == "#!/usr/bin/env bash" and "replicas: 5. Start 5 copies" in lines[1]
