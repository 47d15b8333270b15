"""Precision and tensor parallelism in the cost model, worked out by hand: an FP8 GEMM at the
FP8 rate, a weight-only GEMM at the bf16 rate reading fewer bytes, the KV pool of an FP8
cache, an all-reduce's latency and a thin GEMM's efficiency."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.executors import check_config
from pipeline.job.run import device_metrics
from stages.forward.step_shape import StepShape
from stages.simulator.cost_model import CostModel
from stages.simulator.hardware import GIB, kv_pool_blocks
from stages.simulator.precision import Precision
from tests.conftest import serve
from tests.helpers import spec_of
from tests.test_cost_model import DEVICE, KV_BYTES_PER_TOKEN, LINEAR_PARAMS, LM_HEAD_PARAMS, TINY

# DEVICE with an FP8 peak of 2 TFLOPS (twice its bf16 one).
FP8_DEVICE = dataclasses.replace(DEVICE, fp8_tflops=2.0)
PREFILL = StepShape(16, (2, 64, 4), None)  # 128 tokens: compute-bound GEMMs
DECODE = StepShape(16, None, (4, 8))  # 4 rows: the GEMMs read their weights


def cost(quantization="none", kv="auto", tp=1, **hardware) -> CostModel:
    device = dataclasses.replace(FP8_DEVICE, **hardware)
    return CostModel(spec_of(**TINY), device, tp, precision=Precision(quantization, kv))


def test_an_fp8_gemm_runs_at_the_fp8_rate_and_reads_one_byte_a_weight():
    flops = 2 * LINEAR_PARAMS * 128
    assert cost("fp8").breakdown(PREFILL)["linear"] == pytest.approx(flops / 2e12)
    assert cost("none").breakdown(PREFILL)["linear"] == pytest.approx(flops / 1e12)
    # Decode is bound by the weights' read: one byte a weight instead of two.
    assert cost("fp8").breakdown(DECODE)["linear"] == pytest.approx(LINEAR_PARAMS * 1 / 100e9)
    # A device without an FP8 peak runs FP8 GEMMs at its bf16 rate.
    assert cost("fp8", fp8_tflops=0.0).breakdown(PREFILL)["linear"] == pytest.approx(flops / 1e12)


@pytest.mark.parametrize(("quantization", "weight_bytes"), [("wint8", 1.0), ("wint4", 0.5)])
def test_a_weight_only_gemm_computes_in_bf16_on_fewer_bytes(quantization, weight_bytes):
    flops = 2 * LINEAR_PARAMS * 128
    assert cost(quantization).breakdown(PREFILL)["linear"] == pytest.approx(flops / 1e12)
    # One decode row (2 FLOPs a weight, under the ridge even at half a byte a weight).
    decode = cost(quantization).breakdown(StepShape(16, None, (1, 2)))
    assert decode["linear"] == pytest.approx(LINEAR_PARAMS * weight_bytes / 100e9)
    # The lm head stays in bf16.
    assert decode["lm_head"] == pytest.approx(LM_HEAD_PARAMS * 2 / 100e9)


def test_an_fp8_kv_cache_halves_its_traffic_and_doubles_the_pool():
    parts = cost(kv="fp8").breakdown(DECODE)
    assert parts["decode_attention"] == pytest.approx(128 * KV_BYTES_PER_TOKEN / 2 / 100e9)
    assert parts["kv_write"] == pytest.approx(4 * KV_BYTES_PER_TOKEN / 2 / 100e9)
    spec = spec_of(**TINY)
    # Weights: the layers (and norms) at one byte, the two 1000 x 64 tables at two.
    tables = 2 * LM_HEAD_PARAMS
    weights = (spec.num_parameters() - tables) * 1 + tables * 2
    free = 1 * GIB * (1 - 0.25) - weights - 0.25 * GIB
    fp8 = Precision("fp8", "fp8")
    assert fp8.model_weight_bytes(spec) == weights
    assert kv_pool_blocks(spec, DEVICE, 16, 1, fp8) == int(free // (16 * KV_BYTES_PER_TOKEN / 2))


def test_each_allreduce_pays_the_link_latency():
    # tp=2: two all-reduces in each of 2 layers, 10 us each, beside the bytes' time.
    parts = cost(tp=2, allreduce_latency_s=10e-6).breakdown(DECODE)
    assert parts["allreduce_latency"] == pytest.approx(2 * 2 * 10e-6)
    sent = 2 * 2 * (4 * 64 * 2) * 2 * (2 - 1) / 2
    assert parts["allreduce"] == pytest.approx(sent / 50e9)
    assert cost(tp=1, allreduce_latency_s=10e-6).breakdown(DECODE)["allreduce_latency"] == 0


def test_a_split_prefill_hides_its_allreduce_under_the_other_parts_compute():
    # 128 prefill tokens at tp=2: two all-reduces in each of 2 layers of 128 x 64 bf16
    # values, half of each sent: T seconds on the link. Split in k parts, each part's
    # transfer runs under the next part's compute C: all but 1 / k of min(T, C) is hidden.
    sent = 2 * 2 * (128 * 64 * 2) * 2 * (2 - 1) / 2
    for link_gbs in (50.0, 1e-3):  # the transfer shorter, then longer, than the compute
        whole = cost(tp=2, interconnect_gbs=link_gbs)
        transfer = sent / (link_gbs * 1e9)
        parts = whole.breakdown(PREFILL)
        assert parts["allreduce"] == pytest.approx(transfer)
        compute = parts["linear"] + parts["prefill_attention"]
        for k in (2, 3):
            model = CostModel(whole.spec, whole.hardware, 2, prefill_batch_split=k)
            split = model.breakdown(PREFILL)
            hidden = (1 - 1 / k) * min(transfer, compute)
            assert split["allreduce"] == pytest.approx(transfer - hidden)
            assert split["linear"] == parts["linear"]
    # A decode step is not split: its all-reduce is all exposed.
    decode = CostModel(whole.spec, whole.hardware, 2, prefill_batch_split=2)
    assert decode.breakdown(DECODE)["allreduce"] == whole.breakdown(DECODE)["allreduce"] > 0
    with pytest.raises(ValueError, match="prefill_batch_split=0 must be"):
        CostModel(whole.spec, whole.hardware, 2, prefill_batch_split=0)


def test_a_thin_gemm_loses_efficiency_to_the_fill_time():
    # Four GEMMs a layer; at tp=1 and 128 tokens each averages F = 2 x 128 x P / 8 FLOPs,
    # 1 TFLOPS makes that F / 1e12 seconds busy, and each pays 1 us of fill.
    model = cost(gemm_fill_s=1e-6)
    per_gemm = 2 * 128 * LINEAR_PARAMS / 8
    busy = per_gemm / 1e12
    assert model.gemm_efficiency(per_gemm) == pytest.approx(busy / (busy + 1e-6))
    assert model.breakdown(PREFILL)["linear"] == pytest.approx(8 * (busy + 1e-6))
    # Thinner (tp=2) GEMMs are half the size: a lower efficiency; large ones approach 1.
    thin = cost(tp=2, gemm_fill_s=1e-6)
    assert thin.gemm_efficiency(per_gemm / 2) < model.gemm_efficiency(per_gemm) < 1
    assert model.gemm_efficiency(1e15) == pytest.approx(1.0, abs=1e-6)


def test_the_real_path_refuses_quantization_in_one_line():
    for override in ("quantization=fp8", "kv_cache_dtype=fp8", "quantization=wint4"):
        with pytest.raises(ConfigError, match="simulated only") as err:
            check_config(compose_config([override]))
        assert "\n" not in str(err.value)


def test_a_bad_quantization_name_fails_at_composition():
    with pytest.raises(Exception, match="int3"):
        compose_config(["quantization=int3"])


def test_precision_reaches_the_run_metrics():
    overrides = [
        "executor=simulated",
        "hardware=h100",
        "model=spec/llama31_8b",
        "quantization=fp8",
        "kv_cache_dtype=fp8",
        "workload.num_requests=4",
        "workload.max_prompt_tokens=64",
        "workload.max_new_tokens=4",
    ]
    _, engine = serve(overrides)
    metrics = device_metrics(engine)
    assert metrics["quantization"] == "fp8" and metrics["kv_cache_dtype"] == "fp8"
    spec, hardware = engine.model.spec, engine.model.hardware
    bs = engine.scheduler.kv_cache.block_size
    pool = kv_pool_blocks(spec, hardware, bs, 1, Precision("fp8", "fp8"))
    assert engine.scheduler.kv_cache.num_blocks == pool > kv_pool_blocks(spec, hardware, bs, 1)


def test_summary_and_review_show_the_precision():
    from pipeline.review import metrics_table
    from pipeline.summary import device_label

    fp8 = {"simulated": True, "hardware": "h100", "tp": 2, "quantization": "fp8"}
    fp8["kv_cache_dtype"] = "fp8"
    bf16 = {**fp8, "quantization": "none", "kv_cache_dtype": "auto"}
    # the engine predicted closes the label (a folder without one: native)
    assert device_label(fp8) == "h100 tp2 fp8/fp8 native"
    assert device_label({**fp8, "engine": "vllm"}) == "h100 tp2 fp8/fp8 vllm"
    assert device_label({"simulated": False}) == ""
    table = metrics_table(bf16, fp8)
    assert table["quantization"]["a"] == "none" and table["quantization"]["b"] == "fp8"


def test_all_to_all_links_give_an_allreduce_its_peers_bandwidth():
    # 10 GB/s to each peer, 50 GB/s in all: tp=2 has one peer's links, tp=8 all of them.
    links = dataclasses.replace(FP8_DEVICE, interconnect_peer_gbs=10.0)
    assert links.interconnect_bytes_per_s(2) == 10e9
    assert links.interconnect_bytes_per_s(4) == 30e9
    assert links.interconnect_bytes_per_s(8) == 50e9
    assert FP8_DEVICE.interconnect_bytes_per_s(2) == 50e9  # a switch: all of it at any tp
    parts = CostModel(spec_of(**TINY), links, 2).breakdown(DECODE)
    sent = 2 * 2 * (4 * 64 * 2) * 2 * (2 - 1) / 2
    assert parts["allreduce"] == pytest.approx(sent / 10e9)
