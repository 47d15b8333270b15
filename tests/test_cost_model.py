"""The step cost model against steps worked out by hand on a tiny spec and a round-number
device, the KV pool from capacity, profile files, and `fit` recovering known coefficients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from pipeline.schema import HardwareConf, measured_profile, register_schemas
from stages.forward.step_shape import StepShape
from stages.simulator.cost_model import OVERHEAD, TERMS, CostModel
from stages.simulator.hardware import GIB, HardwareProfile, kv_pool_blocks
from stages.simulator.nnls import nnls
from tests.helpers import schema_kwargs, spec_of

register_schemas()

TINY = dict(
    name="tiny",
    vocab_size=1000,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
)
# TINY with 8 routed experts (2 a token, width 32) and a shared one, MoE from layer 1.
TINY_MOE = dict(
    TINY,
    num_experts=8,
    experts_per_token=2,
    expert_intermediate_size=32,
    num_shared_experts=1,
    moe_layer_start=1,
)
# Per layer: q 64x64, k and v 64x32 each, o 64x64, MLP 3 x 64x128.
LINEAR_PARAMS = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)
LM_HEAD_PARAMS = 1000 * 64
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # layers x (k, v) x KV heads x head_dim x bf16

# 1 TFLOPS, 100 GB/s, 50 GB/s links, nothing lost to efficiency: a ridge of 10 FLOPs a byte.
DEVICE = HardwareProfile(
    **schema_kwargs(
        HardwareConf,
        name="round",
        bf16_tflops=1.0,
        hbm_bandwidth_gbs=100.0,
        hbm_capacity_gib=1.0,
        interconnect_gbs=50.0,
        gemm_efficiency=1.0,
        attention_efficiency=1.0,
        memory_efficiency=1.0,
        interconnect_efficiency=1.0,
        step_overhead_s=0.001,
        compile_s=2.0,
        recompile_s=0.5,
        graph_memory_gib=0.25,
        kv_headroom=0.25,
    )
)
FLOPS, BANDWIDTH, LINK = 1e12, 100e9, 50e9


def tiny_model(tp: int = 1, **hardware) -> CostModel:
    return CostModel(spec_of(**TINY), dataclasses.replace(DEVICE, **hardware), tp)


def test_pure_decode_is_weights_once_plus_kv_slots_when_memory_bound():
    # 4 rows over a bucket of 8 blocks of 16 slots: 128 KV slots read, 4 written.
    shape = StepShape(block_size=16, prefill=None, decode=(4, 8))
    weights = (LINEAR_PARAMS + LM_HEAD_PARAMS) * 2
    total_bytes = weights + 128 * KV_BYTES_PER_TOKEN + 4 * KV_BYTES_PER_TOKEN
    # Memory-bound: 4 rows x 2 FLOPs a weight is under the ridge of 10 FLOPs a byte.
    assert 2 * 4 * (LINEAR_PARAMS + LM_HEAD_PARAMS) / FLOPS < weights / BANDWIDTH
    model = tiny_model()
    parts = model.breakdown(shape)
    assert parts["linear"] == pytest.approx(LINEAR_PARAMS * 2 / BANDWIDTH)
    assert parts["decode_attention"] == pytest.approx(128 * KV_BYTES_PER_TOKEN / BANDWIDTH)
    assert parts["prefill_attention"] == 0 and parts["allreduce"] == 0
    assert model.step_time(shape) == pytest.approx(total_bytes / BANDWIDTH + 0.001)


def test_gpu_decode_reads_the_real_lengths_not_the_bucket():
    shape = StepShape(16, None, (4, 8), decode_lens=(10, 20, 30, 1))
    parts = tiny_model(pads_to_buckets=False).breakdown(shape)
    assert parts["decode_attention"] == pytest.approx(61 * KV_BYTES_PER_TOKEN / BANDWIDTH)
    with pytest.raises(ValueError, match="decode_lens"):
        tiny_model(pads_to_buckets=False).step_time(StepShape(16, None, (4, 8)))


def test_prefill_flops_by_hand_when_compute_bound():
    # 2 rows x 64 tokens, 4 blocks of 16 keys a row: 128 tokens through every GEMM.
    shape = StepShape(block_size=16, prefill=(2, 64, 4), decode=None)
    linear = 2 * LINEAR_PARAMS * 128
    attention = 2 * 4 * 64 * 64 * (4 * 16) * 2  # layers x 4 x seq x keys x heads*head_dim, 2 rows
    lm_head = 2 * 2 * LM_HEAD_PARAMS  # only each row's sampled token
    spec = spec_of(**TINY)
    assert spec.linear_flops(128) == linear
    assert spec.attention_flops(2 * 64 * 64) == attention
    parts = tiny_model().breakdown(shape)
    assert parts["linear"] == pytest.approx(linear / FLOPS)
    assert parts["prefill_attention"] == pytest.approx(attention / FLOPS)
    assert parts["kv_write"] == pytest.approx(128 * KV_BYTES_PER_TOKEN / BANDWIDTH)
    # The lm head reads its weights once for 2 rows: memory-bound.
    assert spec.lm_head_flops(2) == lm_head < LM_HEAD_PARAMS * 2 / BANDWIDTH * FLOPS
    assert parts["lm_head"] == pytest.approx(LM_HEAD_PARAMS * 2 / BANDWIDTH)


def test_gpu_prefill_attends_causally_over_real_context():
    # One chunk of 5 tokens after 7 cached: query i sees 7 + i keys.
    shape = StepShape(16, (1, 16, 1), None, chunk_lens=(5,), context_lens=(7,))
    work = tiny_model(pads_to_buckets=False).work(shape)
    assert work.prefill_pairs == sum(7 + i for i in range(1, 6))
    assert work.linear_tokens == 5 and work.kv_writes == 5 and work.prefill_keys == 12


def test_mixed_step_runs_its_gemms_on_the_concatenated_rows():
    mixed = StepShape(16, (1, 32, 2), (3, 4))
    work = tiny_model().work(mixed)
    assert work.linear_tokens == 32 + 3 and work.sampled_rows == 1 + 3
    assert work.kv_writes == 35 and work.decode_slots == 64 and work.prefill_pairs == 32 * 32


def test_moe_step_reads_only_the_experts_its_tokens_touch():
    spec = spec_of(**TINY_MOE)
    attention = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64)
    dense_mlp = 3 * 64 * 128  # layer 0
    expert, router = 3 * 64 * 32, 64 * 8 + 8
    for tokens, touched in ((1, 2), (3, 8 * (1 - (6 / 8) ** 3))):
        params = attention + dense_mlp + router + (1 + touched) * expert
        assert spec.linear_bytes(tokens) == pytest.approx(params * 2)
    # FLOPs: each token through its top 2 and the shared expert only.
    per_token = attention + dense_mlp + router + 3 * expert
    assert spec.linear_flops(3) == 2 * 3 * per_token


def test_tp_halves_the_weights_per_device_and_adds_the_allreduce():
    shape = StepShape(16, None, (4, 8))
    one, two = tiny_model(tp=1), tiny_model(tp=2)
    assert two.breakdown(shape)["linear"] == pytest.approx(one.breakdown(shape)["linear"] / 2)
    assert one.breakdown(shape)["allreduce"] == 0
    # Two all-reduces a layer of 4 rows x 64 x bf16; a ring sends 2 (tp-1)/tp of each.
    sent = 2 * 2 * (4 * 64 * 2) * 2 * (2 - 1) / 2
    assert two.breakdown(shape)["allreduce"] == pytest.approx(sent / LINK)


def test_a_miss_adds_exactly_the_recompile_penalty():
    model = tiny_model()
    hit, miss = StepShape(16, (2, 64, 4), (4, 8)), StepShape(16, (2, 64, 4), (4, 8), miss=True)
    assert model.step_time(miss) - model.step_time(hit) == pytest.approx(0.5, abs=1e-12)
    assert model.breakdown(miss)["recompile"] == 0.5
    assert model.warmup_time(12) == 24.0


def test_kv_pool_from_capacity():
    spec = spec_of(**TINY)
    free = 1 * GIB * (1 - 0.25) - spec.weight_bytes() - 0.25 * GIB
    assert kv_pool_blocks(spec, DEVICE, 16, 1) == int(free // (16 * KV_BYTES_PER_TOKEN))
    # tp=2 halves the weights and the KV bytes per block on each device.
    free2 = 1 * GIB * 0.75 - spec.weight_bytes(2) - 0.25 * GIB
    assert kv_pool_blocks(spec, DEVICE, 16, 2) == int(free2 // (16 * KV_BYTES_PER_TOKEN / 2))
    with pytest.raises(ValueError, match="leaves no KV cache on round"):
        kv_pool_blocks(spec, dataclasses.replace(DEVICE, graph_memory_gib=0.75), 16, 1)


def test_kv_pool_of_llama_8b_on_gaudi2():
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        spec = instantiate(compose(config_name="config", overrides=["model=spec/llama31_8b"]).model)
        gaudi2 = instantiate(compose(config_name="hardware/gaudi2").hardware)
        h100 = instantiate(compose(config_name="hardware/h100").hardware)
        big = instantiate(compose(config_name="config", overrides=["model=spec/llama31_70b"]).model)
    # 96 GiB less the headroom, 16.06 GB of bf16 weights, the graphs; 128 x 128 KiB a block.
    assert gaudi2.hbm_capacity_gib == 96  # the spec sheet's; the rest from the profile
    reserved = gaudi2.kv_headroom * 96 * GIB + gaudi2.graph_memory_gib * GIB
    free = 96 * GIB - reserved - 8_030_261_248 * 2
    assert kv_pool_blocks(spec, gaudi2, 128, 1) == int(free // (128 * 128 * 1024))
    with pytest.raises(ValueError, match="raise tp"):
        kv_pool_blocks(big, h100, 128, 1)  # 141 GB of weights on an 80 GB device


def test_each_gathered_block_costs_its_coefficient_in_every_layer():
    # Uncalibrated, a block costs only its bytes; calibrated, 25 us per block and layer.
    shape = StepShape(16, (2, 32, 3), (4, 10))  # 2 x 3 prefill blocks and 10 decode blocks
    assert tiny_model().breakdown(shape)["kv_blocks"] == 0.0
    fitted = tiny_model().with_coefficients({"kv_blocks": 25.0})
    assert fitted.breakdown(shape)["kv_blocks"] == pytest.approx((6 + 10) * 2 * 25e-6)
    real = StepShape(16, (2, 32, 3), (4, 10), (20, 5), (0, 30), (17, 33, 1, 16))
    gpu = tiny_model(pads_to_buckets=False).with_coefficients({"kv_blocks": 25.0})
    blocks = 2 + 3 + (2 + 3 + 1 + 1)  # ceil((chunk + context) / 16), ceil(len / 16)
    assert gpu.breakdown(real)["kv_blocks"] == pytest.approx(blocks * 2 * 25e-6)


def test_bad_hardware_and_coefficients_are_one_line_errors():
    with pytest.raises(ValueError, match="gemm_efficiency=1.5"):
        dataclasses.replace(DEVICE, gemm_efficiency=1.5)
    with pytest.raises(ValueError, match="unknown cost coefficients attention"):
        CostModel(spec_of(**TINY), DEVICE, coefficients={"attention": 1.0})
    with pytest.raises(ValueError, match="tp=8"):
        tiny_model(tp=8)


def synthetic_samples(model: CostModel, rng: np.random.Generator, count: int):
    """Steps of varied buckets, timed by `model` itself: prefill, decode and mixed, with
    decode batches on both sides of the ridge so that the GEMMs are seen memory-bound too."""
    samples = []
    for i in range(count):
        prefill = (int(rng.integers(1, 4)), 16 * int(rng.integers(1, 9)), int(rng.integers(1, 9)))
        decode = (int(rng.choice([1, 2, 4, 8, 16, 32])), int(rng.integers(1, 64)))
        kind = i % 3
        shape = StepShape(
            int(rng.choice([16, 64])),
            prefill if kind != 1 else None,
            decode if kind != 0 else None,
            miss=bool(i % 7 == 0),
        )
        samples.append((shape, model.step_time(shape)))
    return samples


def test_fit_recovers_known_coefficients():
    truth = {
        "linear": 1.3,
        "prefill_attention": 0.8,
        "decode_attention": 1.7,
        "kv_write": 2.5,
        "lm_head": 0.9,
        "allreduce": 1.0,  # tp=1: no sample exercises it, so it keeps its value
        "kv_blocks": 30.0,
        OVERHEAD: 0.004,
    }
    made = tiny_model().with_coefficients(truth)
    samples = synthetic_samples(made, np.random.default_rng(0), 60)
    fitted = tiny_model().with_coefficients({"allreduce": 1.0}).fit(samples)
    for term, value in truth.items():
        assert fitted[term] == pytest.approx(value, rel=0.01), term


def test_fit_refuses_terms_the_samples_cannot_tell_apart():
    # At one tp, KV writes and all-reduces both scale with the step's tokens.
    made = tiny_model(tp=2)
    samples = synthetic_samples(made, np.random.default_rng(1), 40)
    with pytest.raises(ValueError, match="cannot tell kv_write, allreduce apart"):
        made.fit(samples)
    fitted = made.fit(samples, terms=[t for t in (*TERMS, OVERHEAD) if t != "kv_write"])
    assert fitted["allreduce"] == pytest.approx(1.0, rel=0.01)
    with pytest.raises(ValueError, match="samples for"):
        made.fit(samples[:3])


def test_nnls_meets_its_optimality_conditions():
    rng = np.random.default_rng(2)
    for _ in range(50):
        a, b = rng.normal(size=(12, 5)), rng.normal(size=12)
        x = nnls(a, b)
        gradient = a.T @ (b - a @ x)
        assert (x >= 0).all()
        assert gradient.max() < 1e-9  # no coefficient could grow and lower the residual
        assert np.abs(gradient[x > 0]).max(initial=0) < 1e-9  # the free ones are optimal


def test_profile_round_trip_and_measured_option(tmp_path):
    model = tiny_model()
    coefficients = {**model.coefficients, "linear": 1.25}
    path = model.write_profile(tmp_path / "round.yaml", coefficients)
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="hardware/measured", overrides=[f"hardware.path={path}"])
    loaded = instantiate(cfg.hardware)
    assert dataclasses.replace(loaded, coefficients={}) == DEVICE
    reloaded = CostModel(model.spec, loaded)
    shape = StepShape(16, (2, 64, 4), (4, 8))
    assert reloaded.step_time(shape) == pytest.approx(
        model.with_coefficients(coefficients).step_time(shape)
    )
    (tmp_path / "bad.yaml").write_text("name: x\nflops: 3\n")
    with pytest.raises(ValueError, match="unknown fields flops"):
        measured_profile(tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="no such file"):
        measured_profile(tmp_path / "none.yaml")


@pytest.mark.parametrize("hardware", ["gaudi2", "gaudi3", "h100", "h200"])
@pytest.mark.parametrize("model", ["llama31_8b", "ernie45_21b_a3b"])
def test_no_decode_step_takes_less_than_the_least_decode_seconds(hardware, model):
    # What bounds the steps a simulated device's run of decode steps plans before the next
    # arrival: a step of any rows, slots and blocks, padded or real, takes at least this.
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        spec = instantiate(compose(config_name="config", overrides=[f"model=spec/{model}"]).model)
        device = instantiate(compose(config_name=f"hardware/{hardware}").hardware)
    cost = CostModel(spec, device, 1)
    least = cost.least_decode_seconds()
    rng = np.random.default_rng(0)
    bs = 128
    for rows in [1, 2, 3, 7, 16, 33, 64, 100, 256]:
        lens = rng.integers(1, 10_000, rows)
        blocks = int(sum(-(-lens // bs)))
        real = StepShape(bs, None, (rows, blocks), decode_lens=tuple(lens.tolist()))
        assert cost.step_time(real) >= least
    # ...and no less: one row of one token takes it and a few microseconds more.
    one = StepShape(bs, None, (1, 1), decode_lens=(1,))
    assert least <= cost.step_time(one) < least + 1e-4
