"""The fast forms a simulated run prices its steps by, against the cost model's terms summed
one by one (breakdown) on every shipped model, hardware profile, precision and tp: a
decode-only step by its row count's rates (fixed + per KV slot + per block), a step with a
prefill by its separable parts; their guards against terms that no longer take those
forms; a run of decode steps against the same steps one at a time."""

from __future__ import annotations

import dataclasses
import itertools
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

import stages.simulator.cost_model as cost_model
from stages.forward.step_shape import StepShape
from stages.model.spec import ModelSpec
from stages.scheduling.request import DecodeRun
from stages.simulator.cost_model import OVERHEAD, TERMS, CostModel
from stages.simulator.device import SimulatedDevice, VirtualClock
from stages.simulator.expert_parallel import PLAIN, ExpertParallel
from stages.simulator.hardware import HardwareProfile
from stages.simulator.precision import KvCacheDtype, Precision, Quantization
from tests.test_cost_model import DEVICE, TINY, spec_of

CONF = Path(__file__).parents[1] / "conf"
MODELS = sorted(p.stem for p in (CONF / "model" / "spec").glob("*.yaml"))
# measured.yaml is a fitted profile's reader: it needs a file.
PROFILES = sorted(p.stem for p in (CONF / "hardware").glob("*.yaml") if p.stem != "measured")
PRECISIONS = [Precision(q, kv) for q, kv in itertools.product(Quantization, KvCacheDtype)]
TPS = (1, 2, 4, 8)
FP8 = Precision(Quantization.fp8, KvCacheDtype.fp8)


@cache
def shipped() -> tuple[dict[str, ModelSpec], dict[str, HardwareProfile]]:
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        specs = {
            m: instantiate(compose(config_name="config", overrides=[f"model=spec/{m}"]).model)
            for m in MODELS
        }
        profiles = {h: instantiate(compose(config_name=f"hardware/{h}").hardware) for h in PROFILES}
    return specs, profiles


def models_to_check() -> list[CostModel]:
    """Every shipped model on every profile (a padding one made to compute real tokens, to
    price its figures the same way): every precision at tp 1, every tp the model splits to
    in bf16, the largest in FP8 with a prefill batch split of 4, a MoE model also expert
    parallel over 8; random coefficients, so that every term (the blocks' too) weighs."""
    specs, profiles = shipped()
    rng = np.random.default_rng(7)
    models = []
    for spec, hw in itertools.product(specs.values(), profiles.values()):
        hw = dataclasses.replace(hw, pads_to_buckets=False)
        ways = [(1, p, 1) for p in PRECISIONS]
        tps = [tp for tp in TPS[1:] if valid_tp(spec, tp)]
        ways += [(tp, PRECISIONS[0], 1) for tp in tps] + [(tps[-1], FP8, 4)]
        layouts = [PLAIN] * len(ways)
        if spec.moe is not None:  # expert parallel over 8: attention dp 8, or tp 2 x dp 4
            ways += [(1, FP8, 1), (2, PRECISIONS[0], 1)]
            layouts += [ExpertParallel(8, 8), ExpertParallel(8, 4, 1.2)]
        for (tp, precision, split), layout in zip(ways, layouts, strict=True):
            coefficients = dict(zip(TERMS, rng.uniform(0, 3, len(TERMS)), strict=True))
            coefficients["kv_blocks"] = rng.uniform(0, 50)
            coefficients[OVERHEAD] = rng.uniform(0, 0.01)
            models.append(CostModel(spec, hw, tp, coefficients, precision, split, layout))
    return models


def valid_tp(spec: ModelSpec, tp: int) -> bool:
    try:
        spec.check_tp(tp)
    except ValueError:
        return False
    return True


def by_terms(cost: CostModel, lens: np.ndarray, block_size: int) -> float:
    """The oracle: a decode-only step's terms one by one, each times its coefficient."""
    shape = StepShape(block_size, None, (len(lens), 1), decode_lens=lens)
    return sum(cost.breakdown(shape).values())


def test_decode_rates_equal_the_terms_on_every_shipped_model_profile_precision_and_tp():
    rng = np.random.default_rng(11)
    models = models_to_check()
    assert len(models) >= len(MODELS) * len(PROFILES) * len(PRECISIONS)
    for cost in models:
        block_size = int(rng.choice([16, 64, 128]))
        # Steps of 0 to 40 rows, each row 1 to 20,000 tokens (a few far beyond any prompt).
        steps = [rng.integers(1, 20_000, rng.integers(0, 41)) for _ in range(3)]
        expected = np.array([by_terms(cost, lens, block_size) for lens in steps])
        rows = np.array([len(lens) for lens in steps])
        slots = np.array([lens.sum() for lens in steps])
        blocks = np.array([(-(-lens // block_size)).sum() for lens in steps])
        each = [
            cost.step_time(StepShape(block_size, None, (len(lens), 1), decode_lens=lens))
            for lens in steps
        ]
        np.testing.assert_allclose(each, expected, rtol=1e-12, atol=0)
        np.testing.assert_allclose(
            cost.decode_seconds(rows, slots, blocks), expected, rtol=1e-12, atol=0
        )
        # One row count for every step, as a run where no row leaves has it.
        same = [steps[0] + j for j in range(3)]
        ends = np.array([by_terms(cost, lens, block_size) for lens in same])
        got = cost.decode_seconds(
            len(steps[0]),
            np.array([lens.sum() for lens in same]),
            np.array([(-(-lens // block_size)).sum() for lens in same]),
        )
        np.testing.assert_allclose(got, ends, rtol=1e-12, atol=0)


def mixed_shape(rng: np.random.Generator, block_size: int) -> StepShape:
    """A step of 1 to 3 prefill chunks (1 to 8192 tokens, after 0 to 20,000 cached) and 0
    to 40 decode rows."""
    chunks = tuple(int(n) for n in rng.integers(1, 8193, rng.integers(1, 4)))
    contexts = tuple(int(n) for n in rng.integers(0, 20_001, len(chunks)) * rng.integers(0, 2))
    lens = rng.integers(1, 20_000, rng.integers(0, 41))
    return StepShape(block_size, (len(chunks), 1, 1), (len(lens), 1), chunks, contexts, lens)


def test_mixed_steps_equal_the_terms_on_every_shipped_model_profile_precision_and_tp():
    rng = np.random.default_rng(13)
    for cost in models_to_check():
        block_size = int(rng.choice([16, 64, 128]))
        for shape in [mixed_shape(rng, block_size) for _ in range(3)]:
            expected = sum(cost.breakdown(shape).values())
            assert cost.step_time(shape) == pytest.approx(expected, rel=1e-12, abs=0)


def test_a_step_whose_decode_sums_are_given_is_priced_as_its_rows_give():
    """A builder's shape carries its decode rows' KV slots and blocks (decode_kv); a device
    prices it by those, to the same float as by the rows."""
    rng = np.random.default_rng(17)
    for cost in models_to_check()[::7]:
        block_size = int(rng.choice([16, 64, 128]))
        for shape in [mixed_shape(rng, block_size) for _ in range(3)]:
            decodes = dataclasses.replace(shape, prefill=None, chunk_lens=(), context_lens=())
            for step in (shape, decodes):
                lens = step.decode_lens
                kv = (int(lens.sum()), int((-(-lens // block_size)).sum()))
                given = dataclasses.replace(step, decode_kv=kv)
                assert cost.step_time(given) == cost.step_time(step)


def test_the_rates_grow_to_the_most_rows_a_run_has():
    cost = CostModel(spec_of(**TINY), dataclasses.replace(DEVICE, pads_to_buckets=False))
    steps = [np.full(rows, 40) + j for j, rows in enumerate([3, 64, 300, 129])]
    got = cost.decode_seconds(
        np.array([len(lens) for lens in steps]),
        np.array([lens.sum() for lens in steps]),
        np.array([(-(-lens // 16)).sum() for lens in steps]),
    )
    np.testing.assert_allclose(got, [by_terms(cost, lens, 16) for lens in steps], rtol=1e-12)
    many = np.full(700, 33)  # a single step beyond the table: it grows
    shape = StepShape(16, None, (1024, 1), decode_lens=many)
    assert cost.step_time(shape) == pytest.approx(by_terms(cost, many, 16), rel=1e-12)


def test_a_miss_adds_the_recompile_penalty_to_a_decode_step():
    cost = CostModel(spec_of(**TINY), dataclasses.replace(DEVICE, pads_to_buckets=False))
    lens = np.array([5, 40, 17])
    hit = StepShape(16, None, (4, 8), decode_lens=lens)
    miss = dataclasses.replace(hit, miss=True)
    assert cost.step_time(miss) - cost.step_time(hit) == pytest.approx(DEVICE.recompile_s)
    assert cost.step_time(hit) == pytest.approx(by_terms(cost, lens, 16), rel=1e-12)


def test_a_term_no_longer_affine_in_the_slots_is_refused(monkeypatch):
    def quadratic_decode(*args, **kwargs):
        terms = term_seconds(*args, **kwargs)
        # Decode attention growing with the square of the slots it reads.
        return terms | {"decode_attention": terms["decode_attention"] ** 2 * 1e3}

    term_seconds = cost_model.term_seconds
    monkeypatch.setattr(cost_model, "term_seconds", quadratic_decode)
    cost = CostModel(spec_of(**TINY), dataclasses.replace(DEVICE, pads_to_buckets=False))
    with pytest.raises(RuntimeError, match="no longer affine"):
        cost.decode_seconds(3, np.array([100, 103]), np.array([9, 9]))
    with pytest.raises(RuntimeError, match="no longer affine"):
        cost.step_time(StepShape(16, None, (4, 8), decode_lens=np.array([5, 40, 17])))


@pytest.mark.parametrize("change", ["lm head by tokens", "prefill attention summed"])
def test_terms_that_no_longer_fall_apart_are_refused(monkeypatch, change):
    def coupled(a, *args, **kwargs):
        terms = term_seconds(a, *args, **kwargs)
        if change == "lm head by tokens":  # the lm head slowed by the step's tokens
            return terms | {"lm_head": terms["lm_head"] * (1 + a.linear_flops * 1e-9)}
        # prefill attention's FLOPs and bytes added, not a roofline
        hw = args[0]
        both = a.prefill_attention_flops / hw.attention_flops_per_s
        return terms | {"prefill_attention": both + a.prefill_kv_bytes / hw.memory_bytes_per_s}

    term_seconds = cost_model.term_seconds
    monkeypatch.setattr(cost_model, "term_seconds", coupled)
    cost = CostModel(spec_of(**TINY), dataclasses.replace(DEVICE, pads_to_buckets=False))
    shape = StepShape(16, (1, 32, 2), (2, 4), (20,), (5,), np.array([17, 40]))
    with pytest.raises(RuntimeError, match="no longer fall apart"):
        cost.step_time(shape)


def test_a_run_of_decodes_equals_its_steps_one_by_one_when_widths_come_back():
    # Rows 0 and 1 stay 3 steps, row 2 leaves after 2: the blocks go 2 + 3 + 2, 3 + 4 + 2,
    # 3 + 4, their bucket widths 8, 16, 8. The 16-wide graph compiles in the middle.
    lens, stays, bs = np.array([32, 48, 20]), np.array([3, 3, 2]), 16
    blocks = np.array([7, 9, 7])
    widths, padded_rows = np.array([8, 16, 8]), np.array([4, 4, 4])
    hw = dataclasses.replace(DEVICE, pads_to_buckets=False)
    run = DecodeRun([None] * 3, lens, stays, blocks, bs, padded_rows, widths)  # type: ignore[list-item]
    leap = SimulatedDevice(spec_of(**TINY), hw, VirtualClock())
    leap.clock.advance(3.0)
    ends = leap.run_decodes(run, until=float("inf"))

    alone = SimulatedDevice(spec_of(**TINY), hw, VirtualClock())
    alone.clock.advance(3.0)
    by_step = []
    for j in range(3):
        rows = lens[stays > j] + j
        width = int(widths[j])
        shape = StepShape(bs, None, (4, width), decode_lens=rows)
        new = ("decode", (4, width)) not in alone.compiled
        alone.compiled.add(("decode", (4, width)))
        alone.clock.advance(alone.cost.step_time(shape) + new * hw.recompile_s)
        by_step.append(alone.clock())
        assert int((-(-rows // bs)).sum()) == blocks[j]
    assert leap.recompiles == 2 and leap.compiled == alone.compiled
    np.testing.assert_allclose(ends, by_step, rtol=1e-12)
    assert leap.clock() == ends[-1]
