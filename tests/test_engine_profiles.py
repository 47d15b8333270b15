"""engine=: one choice sets the step rules, the shape grid and the limits a run predicts;
the scheduler's and metadata builder's own keys stay overrides on top; an engine refuses a
device, block size or model it does not serve with one line."""

from __future__ import annotations

import json
import re

import pytest
from omegaconf import OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.config.engine_profile import check_engine, engine_refusal
from stages.forward.cudagraph import capture_sizes
from tests.helpers import make_config, run_cli, serve

ERNIE = ["executor=simulated", "model=spec/ernie45_21b_a3b", "max_model_len=4096"]
BURST = ["workload=synthetic", "workload.num_requests=24", "workload.rate=0",
         "workload.min_prompt_tokens=100", "workload.max_prompt_tokens=900",
         "workload.min_new_tokens=4", "workload.max_new_tokens=16", "max_num_seqs=32",
         "max_tokens=4096", "block_size=128", "max_model_len=4096"]  # fmt: skip


@pytest.mark.parametrize(
    "engine, device, bucketing, capture, rows",
    [("native", "gaudi2", "linear", "vllm", 0),
     ("fastdeploy", "gaudi2", "fastdeploy", "fastdeploy", 3),
     ("vllm", "gaudi2", "vllm_exp", "vllm", 0), ("vllm", "h100", "cudagraph", "vllm", 0),
     ("sglang", "h100", "cudagraph", "sglang", 0), ("trtllm", "h200", "cudagraph", "trtllm", 0)],
)  # fmt: skip
def test_an_engine_sets_the_step_rules_and_grid(engine, device, bucketing, capture, rows):
    cfg = make_config([*ERNIE, f"hardware={device}", f"engine={engine}", "block_size=128"])
    assert cfg.metadata.bucketing == bucketing
    assert cfg.metadata.capture == capture
    assert cfg.scheduler.max_prefill_rows == rows


def test_the_old_keys_override_the_profile():
    over = ["scheduler.max_prefill_rows=5", "metadata.bucketing=exponential",
            "metadata.fastdeploy.warmup_model_len=8192"]  # fmt: skip
    cfg = make_config([*ERNIE, "hardware=gaudi2", "engine=fastdeploy", *over])
    assert cfg.scheduler.max_prefill_rows == 5
    assert cfg.metadata.bucketing == "exponential"
    assert cfg.metadata.fastdeploy.warmup_model_len == 8192


def test_fastdeploy_steps_prefill_by_the_block():
    # its benchmark README: SEQUENCE_STEP_PREFILL is the block size
    for bs in (64, 128):
        cfg = make_config([*ERNIE, "hardware=gaudi2", "engine=fastdeploy", f"block_size={bs}"])
        assert cfg.metadata.fastdeploy.sequence_step_prefill == bs


@pytest.mark.parametrize(
    "engine, device, extra, words",
    [("sglang", "gaudi2", [], "does not run on gaudi2"),
     ("vllm", "gaudi2", ["block_size=64"], "block_size=64: engine=vllm on gaudi2"),
     ("vllm", "h100", ["block_size=8"], "takes [16, 32, 64, 128]"),
     ("fastdeploy", "gaudi2", ["model=spec/llama31_8b"], "(LlamaForCausalLM): engine=fastdeploy")],
)  # fmt: skip
def test_an_engine_refuses_what_it_does_not_serve(engine, device, extra, words):
    cfg = make_config([*ERNIE, f"hardware={device}", f"engine={engine}", "block_size=128", *extra])
    with pytest.raises(ConfigError, match=re.escape(words)) as err:
        check_engine(cfg)
    assert "\n" not in str(err.value)
    native = make_config([*ERNIE, f"hardware={device}", "block_size=128", *extra])
    assert engine_refusal(OmegaConf.to_container(native, resolve=True)) is None


def test_fastdeploy_never_prefills_more_than_its_cap():
    steps: list = []
    serve([*BURST, *ERNIE[:2], "hardware=gaudi2", "engine=fastdeploy"], steps=steps)
    counts = [len(s.prefill) for s in steps]
    assert max(counts) == 3  # a burst of 24 prompts fills the cap, never more
    native: list = []
    serve([*BURST, *ERNIE[:2], "hardware=gaudi2"], steps=native)
    assert max(len(s.prefill) for s in native) > 3


def test_sglang_runs_its_prefills_in_steps_of_their_own():
    # SGLang's order (no --enable-mixed-chunk): no step both prefills and decodes, while a
    # burst arriving over time makes the other engines mix them
    steps: list = []
    burst = [*BURST, "workload.rate=20"]
    serve([*burst, *ERNIE[:2], "hardware=h100", "engine=sglang"], steps=steps)
    assert steps and not any(s.prefill and s.decode for s in steps)
    assert any(s.decode for s in steps) and any(s.prefill for s in steps)
    mixed: list = []
    serve([*burst, *ERNIE[:2], "hardware=h100", "engine=vllm"], steps=mixed)
    assert any(s.prefill and s.decode for s in mixed)


def test_capture_sizes_of_each_engine_by_hand():
    # SGLang: 1, 2, 4, 8, 12, then multiples of 8 to 256, up to cuda_graph_max_bs and the requests
    assert capture_sizes(40, "sglang", 256) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert capture_sizes(600, "sglang", 320)[-4:] == [272, 288, 304, 320]
    # TensorRT-LLM: 1..31, 32, 64, 128 (max_batch_size 128), whatever the server's batch
    assert capture_sizes(8, "trtllm", 128) == [*range(1, 33), 64, 128]
    assert capture_sizes(8, "trtllm", 1024)[-3:] == [128, 256, 512]
    # FastDeploy: 1, 2, 4, multiples of 8 to 128, of 16 to 256, and max_num_seqs itself
    assert capture_sizes(20, "fastdeploy") == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(150, "fastdeploy")[-3:] == [128, 144, 150]


def test_metrics_and_summary_name_the_engine(tmp_path):
    args = [*ERNIE[:2], "hardware=gaudi2", "engine=fastdeploy", *BURST[:3],
            "workload.num_requests=4", "max_model_len=1024", "max_tokens=1024"]  # fmt: skip
    done = run_cli(tmp_path, "pipeline", "-m", *args, "seed=0,1", f"hydra.sweep.dir={tmp_path}/s")
    assert done.returncode == 0, done.stderr[-2000:]
    for job in ("0", "1"):
        metrics = json.loads((tmp_path / "s" / job / "metrics.json").read_text())
        assert metrics["engine"] == "fastdeploy"
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "Engine predicted: `fastdeploy`." in summary
    assert "gaudi2 tp1 none/auto fastdeploy" in summary


HOST = ["executor=simulated", "hardware=h100", "model=spec/llama31_8b", "warmup=true",
        "max_num_seqs=4", "max_model_len=2048", "max_tokens=2048", "workload=synthetic",
        "workload.rate=0",
        "workload.num_requests=2", "workload.min_prompt_tokens=500",
        "workload.max_prompt_tokens=500", "workload.min_new_tokens=10",
        "workload.max_new_tokens=10", "engine=vllm_v0"]  # fmt: skip


def served_token_times(overrides: list[str]) -> list[list[float]]:
    from pipeline.executors import build_engine

    engine, requests = build_engine(make_config([*HOST, *overrides]))
    engine.warmup()
    engine.run(requests)
    return [r.token_times for r in requests]


def test_an_engines_host_time_adds_to_each_step_by_its_rows():
    plain = ["engine.step_host_s=0", "engine.row_host_s=0", "engine.gemm_rate=1"]
    base = served_token_times(plain)
    timed = served_token_times([*plain, "engine.step_host_s=0.003", "engine.row_host_s=0.0005"])
    # Both prompts prefill in one step and decode together: every step runs two rows, so
    # each takes 3 ms + 2 x 0.5 ms more; the k-th token comes k + 1 steps' 4 ms later.
    for times, base_times in zip(timed, base, strict=True):
        assert [t - b for t, b in zip(times, base_times, strict=True)] == pytest.approx(
            [0.004 * (k + 1) for k in range(len(times))]
        )


def test_an_engines_gemm_rate_slows_its_gemms_alone_and_bad_figures_are_refused():
    from pipeline.config.engine_profile import engine_hardware, host_time
    from pipeline.executors.build import build

    cfg = make_config([*HOST, "engine.gemm_rate=0.5"])
    device = build(cfg.hardware)
    slower = engine_hardware(cfg, device)
    assert slower.gemm_efficiency == pytest.approx(device.gemm_efficiency / 2)
    assert (slower.memory_efficiency, slower.step_overhead_s) == (
        device.memory_efficiency, device.step_overhead_s)  # fmt: skip
    for bad, key in (("engine.gemm_rate=0", "engine.gemm_rate=0"),
                     ("engine.gemm_rate=1.5", "engine.gemm_rate=1.5"),
                     ("engine.row_host_s=-1", "engine.row_host_s=-1")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(key)):
            bad_cfg = make_config([*HOST, bad])
            engine_hardware(bad_cfg, device)
            host_time(bad_cfg)


@pytest.mark.parametrize("engine", ["native", "fastdeploy", "vllm", "sglang", "trtllm"])
def test_only_the_vllm_0_6_profile_adds_host_time_or_slows_gemms(engine):
    cfg = make_config([*HOST[:-1], f"engine={engine}"])
    assert (cfg.engine.step_host_s, cfg.engine.row_host_s, cfg.engine.gemm_rate) == (0, 0, 1)
    old = make_config(HOST)
    assert old.engine.name == "vllm" and old.engine.row_host_s > 0 and old.engine.gemm_rate < 1
