"""A GPU runs like a GPU: vLLM's capture sizes (by hand from its rule), decode batches padded
to them, real-token prefill budgets, a capture warmup instead of a bucket grid; Gaudi keeps
its buckets; both overridable."""

from __future__ import annotations

import pytest

from pipeline.executors import build_engine
from stages.forward.cudagraph import capture_sizes
from tests.helpers import make_config, serve

DEVICE = ["executor=simulated", "model=spec/llama31_8b", "max_num_seqs=64", "max_tokens=2048",
          "max_model_len=4096", "warmup=true"]  # fmt: skip


def test_capture_sizes_by_hand():
    # vLLM: largest = min(2 x max_num_seqs, 512); 1, 2, 4, multiples of 8 below 256, then of 16
    assert capture_sizes(4) == [1, 2, 4, 8]
    assert capture_sizes(8) == [1, 2, 4, 8, 16]
    assert capture_sizes(64) == [1, 2, 4, *range(8, 129, 8)]
    big = capture_sizes(1024)
    assert big[:3] == [1, 2, 4] and big[-1] == 512 and len(big) == 3 + 31 + 17
    assert big[big.index(248) + 1 :] == list(range(256, 513, 16))


@pytest.mark.parametrize(
    "device, bucketing, budget", [("h100", "cudagraph", "real"), ("h200", "cudagraph", "real"),
                                  ("gaudi2", "linear", "padded"), ("gaudi3", "linear", "padded")],
)  # fmt: skip
def test_the_execution_model_follows_the_device(device, bucketing, budget):
    cfg = make_config([*DEVICE, f"hardware={device}"])
    assert (cfg.metadata.bucketing, cfg.scheduler.budget) == (bucketing, budget)
    over = make_config([*DEVICE, f"hardware={device}", "metadata.bucketing=exponential",
                        "scheduler.budget=padded"])  # fmt: skip
    assert (over.metadata.bucketing, over.scheduler.budget) == ("exponential", "padded")


def test_a_gpu_captures_graphs_and_pads_decodes_to_them():
    engine, _ = build_engine(make_config([*DEVICE, "hardware=h100"]))
    sizes = capture_sizes(64)
    assert engine.warmup_counts() == {"profile_run": 1, "cuda_graphs": len(sizes)}
    compile_s = engine.model.hardware.compile_s
    assert engine.warmup() == pytest.approx((1 + len(sizes)) * compile_s)
    buckets = engine.metadata.buckets
    for rows, padded in ((1, 1), (3, 4), (5, 8), (9, 16), (64, 64), (100, 104)):
        assert buckets.fitted("decode", {"batch": rows, "blocks": 3})[0] == padded
    assert not engine.scheduler.padded_budget  # real tokens, as vLLM counts its budget
    # one prefill bucket, the largest: a GPU computes the real tokens, no step pads to it
    assert all(len(buckets.sizes[axis]) == 1 for axis in ("prefill_batch", "prefill_seq"))


def test_a_gpu_prefill_computes_its_real_tokens():
    # token utilization counts what the device computes: a GPU's prefill tokens unpadded,
    # its decode rows at the capture size; Gaudi's prefill at the bucket's rows x seq
    for device, pads_prefill in (("h100", False), ("gaudi2", True)):
        steps: list = []
        serve([*DEVICE, f"hardware={device}"], steps=steps)
        with_prefill = [s for s in steps if s.prefill]
        assert with_prefill
        for step in with_prefill:
            real = sum(chunk["end"] - chunk["start"] for chunk in step.prefill)
            rows, seq, _ = step.padded["prefill"]
            decode_rows = step.padded["decode"][0] if step.decode else 0
            prefill = rows * seq if pads_prefill else real
            assert step.padded_tokens == prefill + decode_rows


def test_gaudi_keeps_its_bucket_grid():
    engine, _ = build_engine(make_config([*DEVICE, "hardware=gaudi3"]))
    counts = engine.warmup_counts()
    assert set(counts) >= {"prefill", "decode"} and sum(counts.values()) > 1000


def plan_config(overrides: list[str]):
    """The plan's composed config (conf/plan.yaml), as a plan job has it."""
    from hydra import compose, initialize_config_module

    from pipeline.config.compose import schemas_registered

    schemas_registered()
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="plan", overrides=overrides)


def test_a_plan_keeps_gaudi_warmups_within_the_readiness_budget():
    gaudi = plan_config(["model=spec/llama31_8b", "hardware=gaudi3", "max_num_seqs=64",
                         "max_tokens=2048", "max_model_len=4096"])  # fmt: skip
    assert gaudi.plan.max_warmup_s == 3600
    assert gaudi.metadata.bucketing == "exponential"
    engine, _ = build_engine(gaudi)
    graphs = sum(engine.warmup_counts().values())
    assert graphs * engine.model.hardware.compile_s <= 3600
    gpu = plan_config(["model=spec/llama31_8b", "hardware=h100"])
    assert gpu.metadata.bucketing == "cudagraph"
    assert plan_config(["hardware=gaudi3", "plan.hpu_bucketing=linear"]).metadata.bucketing == (
        "linear"
    )
