"""ready_s: the checkpoint's bytes over plan.load_gbs plus the device's capture or compile
and what each engine compiles besides; plan.max_warmup_s bounds it."""

from __future__ import annotations

import pytest

from pipeline.config.checks import describe_model
from pipeline.plan import replica_readiness
from pipeline.plan.readiness import ENGINE_COMPILE_S, GPU_ENGINES, HPU_ENGINES, readiness
from tests.helpers import make_config


def test_parts_add_up_by_hand():
    ready = readiness(weight_bytes=70e9, load_gbs=2.0, warmup_s=3.0, pads_to_buckets=False)
    assert ready.load_s == pytest.approx(35.0)
    assert set(ready.by_engine) == set(GPU_ENGINES)
    assert ready.by_engine["sglang"] == pytest.approx(38.0)
    assert ready.ready_s == pytest.approx(38.0 + ENGINE_COMPILE_S["vllm-cuda"])
    gaudi = readiness(70e9, 2.0, 1800.0, pads_to_buckets=True)
    assert set(gaudi.by_engine) == set(HPU_ENGINES) and gaudi.ready_s == pytest.approx(1835.0)
    # the run's engine alone: SGLang captures graphs, no torch.compile
    assert readiness(70e9, 2.0, 3.0, False, "sglang").by_engine == {"sglang": pytest.approx(38.0)}
    assert set(readiness(70e9, 2.0, 3.0, True, "vllm").by_engine) == {"vllm-gaudi"}
    with pytest.raises(ValueError, match="plan.load_gbs"):
        readiness(1.0, 0.0, 0.0, False)


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_a_70b_gpu_replica_takes_over_a_minute(device):
    # Llama-3.1-70B: ~70.6e9 parameters; in FP8 about 70.6 GB (tables in bf16), at 1 GB/s
    cfg = make_config(["executor=simulated", f"hardware={device}", "model=spec/llama31_70b",
                       "quantization=fp8"])  # fmt: skip
    spec, _ = describe_model(cfg)
    ready = replica_readiness(cfg, warmup_s=2.0)
    assert ready.load_s == pytest.approx(spec.num_parameters(1) / 1e9, rel=0.05)
    assert ready.ready_s > 60
