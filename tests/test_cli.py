"""The real command line: bad input gets one clear line and a non-zero exit; a run leaves
every file of the contract."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from hydra.errors import ConfigCompositionException

from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.executors import check_config
from tests.helpers import ONE_THREAD, SMALL, run_cli


def pipeline(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    return run_cli(tmp_path, "pipeline", f"hydra.run.dir={tmp_path}", *overrides)


BAD = {
    "misspelt key": (["max_tokns=512"], "Key 'max_tokns' not in 'PipelineConf'"),
    "misspelt stage key": (["scheduler.align_chunk=false"], "Key 'align_chunk' not in"),
    "wrong type": (["block_size=abc"], "could not be converted to Integer"),
    "unknown option": (["scheduler=fastest"], "Could not find 'scheduler/fastest'"),
    "block size not a power of two": (["block_size=48"], "block_size=48 is not a power of two"),
    "budget below a block": (["max_tokens=64", "max_num_seqs=4"], "max_tokens=64 < block_size=128"),
    "budget below the batch": (["max_tokens=256", "max_num_seqs=512"], "max_num_seqs=512"),
    "hpu ops without the device": (["attention.ops=intel_hpu"], "needs device=intel_hpu"),
    # a closed set's key: the override, then OmegaConf's line naming the allowed values
    "unknown objective": (["plan.objective=fastest"], "[goodput_per_card, cost]"),
    "unknown device": (["device=gpu"], "Invalid value 'gpu', expected one of [cpu, intel_hpu]"),
    "unknown ops": (["attention.ops=cuda"], "'cuda', expected one of [cpu, intel_hpu]"),
    "unknown dtype": (["model.dtype=fp32"], "expected one of [float32, float16, bfloat16]"),
    "unknown trace format": (
        ["workload=trace", "workload.format=csv"],
        "expected one of [auto, azure, burstgpt, mooncake, sharegpt, vidur]",
    ),
    "unknown too-long rule": (
        ["workload=trace", "workload.too_long=drop"],
        "'drop', expected one of [clip, error]",
    ),
}


@pytest.mark.parametrize(("overrides", "message"), BAD.values(), ids=BAD.keys())
def test_bad_config_gives_one_clear_line(overrides, message):
    """Composed and checked in-process, as the command line does before it builds anything."""
    with pytest.raises((ConfigCompositionException, ConfigError)) as err:
        check_config(compose_config(overrides))
    first_line = str(err.value).splitlines()[0] + str(err.value.__cause__ or "")
    assert message in first_line
    if isinstance(err.value, ConfigCompositionException) and err.value.__cause__:
        assert overrides[-1] in str(err.value)  # the override at fault, named


@pytest.mark.slow
def test_a_bad_config_exits_2_with_one_line(tmp_path):
    result = pipeline(tmp_path, "block_size=48")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "Error: block_size=48 is not a power of two: set block_size=16, 64 or 128"
    ]


@pytest.mark.slow
def test_a_limit_added_to_a_stage_exits_2_with_one_line(tmp_path):
    """+scheduler.block_size=8 opens the stage's node for a key its schema lacks: refused
    before anything is built, naming the key that owns the limit."""
    result = pipeline(tmp_path, "+scheduler.block_size=8")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "Error: scheduler.block_size=8: block_size is the run's, not ChunkedSchedulerConf's; "
        "set block_size=8 instead"
    ]


@pytest.mark.slow
def test_a_misspelt_key_fails_at_composition(tmp_path):
    result = pipeline(tmp_path, "max_tokns=512")
    assert result.returncode != 0
    assert "Key 'max_tokns' not in 'PipelineConf'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_run_leaves_the_contract_files(tmp_path):
    result = pipeline(tmp_path, *SMALL, ONE_THREAD, "max_tokens=32")
    assert result.returncode == 0, result.stderr
    names = {p.name for p in tmp_path.iterdir()}
    assert {"resolved_config.yaml", ".hydra", "generations.jsonl", "steps.jsonl"} <= names
    assert {"metrics.json", "pipeline.log"} <= names
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {
        p.name for p in (tmp_path / ".hydra").iterdir()
    }

    resolved = yaml.safe_load((tmp_path / "resolved_config.yaml").read_text())
    assert resolved["scheduler"]["max_tokens"] == 32  # interpolations resolved

    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").open()]
    assert [g["id"] for g in generations] == [f"req-{i}" for i in range(6)]
    for g in generations:
        assert set(g) >= {
            "id", "prompt", "prompt_tokens", "output_ids", "output_text", "finish_reason",
            "error", "ttft_s", "e2e_s", "itl_s",
        }  # fmt: skip
        assert g["finish_reason"] == "length" and g["error"] is None
        assert len(g["itl_s"]) == len(g["output_ids"]) - 1
        assert 0 < g["ttft_s"] <= g["e2e_s"]

    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").open()]
    assert {s["mode"] for s in steps} <= {"extend", "decode", "mixed"}
    for s in steps:
        assert set(s) >= {
            "step",
            "mode",
            "prefill",
            "decode",
            "num_tokens",
            "padded_tokens",
            "bucket",
            "duration_s",
        }
        assert 0 < s["num_tokens"] <= min(32, s["padded_tokens"])
    # Every prompt token was prefilled exactly once (no preemption in this run).
    for g in generations:
        covered = sorted(
            (c["start"], c["end"]) for s in steps for c in s["prefill"] if c["id"] == g["id"]
        )
        assert covered[0][0] == 0 and covered[-1][1] == g["prompt_tokens"]
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))

    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "ok"
    assert metrics["num_requests"] == 6 and metrics["num_errors"] == 0
    assert metrics["output_tokens"] == sum(len(g["output_ids"]) for g in generations)
    assert metrics["input_tokens"] == sum(g["prompt_tokens"] for g in generations)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(metrics[key]) == {"mean", "p50", "p90", "p99"}
    assert 0 < metrics["token_utilization"] <= 1
    for key in ("duration_s", "output_throughput", "bucket_misses", "warmup_s", "num_preemptions"):
        assert key in metrics

    log_lines = [json.loads(line) for line in (tmp_path / "pipeline.log").open()]
    assert any(line["event"] == "run_finished" for line in log_lines)
