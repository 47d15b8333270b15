"""Capacity search: the answer meets the SLO, the next load probed above it does not, and
each verdict holds when that load is served again in full (no early stop)."""

from __future__ import annotations

import json

import pytest

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from pipeline.job.slo import EarlyVerdict, Slo, is_good, needed_good, slo_metrics
from pipeline.plan.capacity import capacity_search, load_axis
from pipeline.plan.capacity_estimate import rate_ceiling
from stages.scheduling.request import Request
from tests.helpers import make_config

SMALL_DEPLOYMENT = [
    "executor=simulated",
    "hardware=gaudi2",
    "model=spec/llama31_8b",
    "warmup=true",
    "block_size=128",
    "max_model_len=1024",
    "max_num_seqs=8",
    "max_tokens=512",
    "workload.num_requests=40",
    "workload.min_prompt_tokens=100",
    "workload.max_prompt_tokens=600",
    "workload.min_new_tokens=20",
    "workload.max_new_tokens=60",
    "slo.ttft_ms=400",
    "slo.tpot_ms=40",
]


def attainment_when_served(cfg, key: str, value) -> float:
    """The SLO attainment of a plain, complete run at one load: the independent check."""
    cfg = cfg.copy()
    node, _, leaf = key.rpartition(".")
    cfg[node][leaf] = value
    engine, requests = build_engine(cfg)
    engine.warmup()
    duration = engine.run(requests)
    return slo_metrics(requests, duration, Slo.of(cfg.slo))["slo_attainment"]


@pytest.mark.parametrize(
    "extra", [["workload.rate=2"], ["workload.concurrency=2"]], ids=["open loop", "closed loop"]
)
def test_the_answer_meets_the_slo_and_the_next_load_above_does_not(tmp_path, extra):
    cfg = make_config([*SMALL_DEPLOYMENT, *extra])
    result = capacity_search(cfg, tmp_path)
    assert result["capacity_found"], "the bracket should close within the probe budget"
    axis = load_axis(cfg)
    lo, hi = result["capacity"], result["capacity_above"]
    assert lo < hi
    if axis.integer:
        assert hi == lo + 1
    else:
        assert hi <= lo * (1 + cfg.capacity.tolerance)
    target = cfg.slo.attainment
    assert attainment_when_served(cfg, axis.key, axis.value(lo)) >= target
    assert attainment_when_served(cfg, axis.key, axis.value(hi)) < target
    report = json.loads((tmp_path / "capacity.json").read_text())
    assert len(report["probes"]) == result["capacity_probes"]
    for probe in report["probes"]:  # every probe kept, metrics and config only
        folder = tmp_path / probe["folder"]
        assert (folder / "metrics.json").is_file()
        assert not (folder / "steps.jsonl").exists() and not (folder / "generations.jsonl").exists()
    assert json.loads((tmp_path / "metrics.json").read_text())["capacity"] == lo


def test_a_search_without_an_slo_is_refused(tmp_path):
    cfg = make_config([*SMALL_DEPLOYMENT[:-2]])
    with pytest.raises(ConfigError, match="needs an SLO"):
        capacity_search(cfg, tmp_path)


def test_a_configuration_that_refuses_too_many_requests_is_given_up_at_once(tmp_path):
    # whole prompts within max_tokens=256: most of 100..600-token prompts are refused
    cfg = make_config([*SMALL_DEPLOYMENT, "scheduler=whole", "max_tokens=256", "workload.rate=2"])
    result = capacity_search(cfg, tmp_path)
    assert not result["capacity_found"] and result["capacity_probes"] == 1
    assert "refused at any load" in result["capacity_reason"]
    assert result["refused_requests"] > 0.1 * result["num_requests"]


@pytest.mark.parametrize(
    "extra",
    [
        ["workload.rate=30"],  # queues grow: TTFT bounds run out while requests wait
        ["workload.concurrency=8", "slo.ttft_ms=0", "slo.tpot_ms=12"],  # too slow per token
        ["workload.rate=30", "slo.ttft_ms=0", "slo.tpot_ms=0", "slo.e2e_ms=1500"],
    ],
    ids=["ttft", "tpot closed loop", "e2e"],
)
def test_an_early_verdict_counts_only_requests_that_miss_in_the_full_run(extra):
    cfg = make_config([*SMALL_DEPLOYMENT, *extra])
    slo = Slo.of(cfg.slo)
    engine, requests = build_engine(cfg)
    engine.warmup()
    verdict = EarlyVerdict(slo, requests, arrivals_fixed=not engine.concurrency)
    engine.run(requests, on_finish=verdict.on_finish, stop=verdict)
    assert verdict.decided_at is not None and verdict.missed_in_flight > 0
    assert any(not r.finished for r in requests), "the run should have stopped early"
    counted = {r.index for r in requests if r.seq_id in verdict.missed}
    engine, full = build_engine(cfg)  # the same requests, served to the end
    engine.warmup()
    engine.run(full)
    missed = {r.index for r in full if not is_good(r, slo)}
    assert counted <= missed  # nobody counted as missed met the SLO after all
    assert len(missed) > verdict.allowed  # so the full run misses the target too
    assert len(full) - len(missed) < needed_good(len(full), slo.attainment)


def test_deciding_probes_early_finds_the_same_capacity(tmp_path):
    quick = [*SMALL_DEPLOYMENT, "workload.rate=8", "capacity.tolerance=0.2"]
    quick.append("capacity.estimate_start=false")  # from rate 8: four probes, one decided early
    runs = {}
    for name, decide in (("early", "true"), ("full", "false")):
        (tmp_path / name).mkdir()
        cfg = make_config([*quick, f"capacity.decide_early={decide}"])
        result = capacity_search(cfg, tmp_path / name)
        probes = json.loads((tmp_path / name / "capacity.json").read_text())["probes"]
        runs[name] = result, [(p["load"], p["met"], p["status"]) for p in probes]
    (early, early_probes), (full, full_probes) = runs["early"], runs["full"]
    for key in ("capacity_found", "capacity", "capacity_above", "capacity_probes"):
        assert early[key] == full[key], key
    assert [p[:2] for p in early_probes] == [p[:2] for p in full_probes]  # the same verdicts
    assert "stopped" in [p[2] for p in early_probes], "nothing decided early: tests nothing"
    assert "stopped" not in [p[2] for p in full_probes]


def test_a_configuration_whose_warmup_is_too_long_is_not_searched(tmp_path):
    cfg = make_config([*SMALL_DEPLOYMENT, "workload.rate=2"])
    result = capacity_search(cfg, tmp_path, max_warmup_s=1.0)
    assert result["capacity_probes"] == 0 and not result["capacity_found"]
    assert result["predicted_warmup_s"] > 1.0
    assert "plan.max_warmup_s=1" in result["capacity_reason"]
    assert not (tmp_path / "probes").exists()


class LinearDevice:
    """A device whose steps take hand-picked times: prefill 0.1 s; a decode step of B rows
    0.01 + 0.001 x B s."""

    def step_time(self, shape):
        if shape.prefill is not None:
            return 0.1
        return 0.01 + 0.001 * shape.decode[0]


def test_the_rate_ceiling_by_hand():
    requests = [Request(str(i), i, "", [1] * 100, 50) for i in range(4)]  # P 100, O 50
    # R(B) = B / (50 (0.01 + 0.001 B) + 0.1 B) = B / (0.5 + 0.15 B), growing with B
    got = rate_ceiling(LinearDevice(), requests, 16, 8, 10_000)
    assert got.batch == 8 and got.rate == pytest.approx(8 / 1.7)
    # per-token wait d(B) / (1 - R(B) 0.1): B=2 gives 0.012 / (1 - 0.2 / 0.8) = 16 ms,
    # B=3 0.013 / (1 - 0.3 / 0.95) = 19.0 ms: a 17 ms TPOT bound stops at B=2
    got = rate_ceiling(LinearDevice(), requests, 16, 8, 10_000, tpot_ms=17)
    assert got.batch == 2 and got.rate == pytest.approx(2 / 0.8)
    # the KV pool: 150 tokens = 10 blocks of 16 a request; 35 blocks hold 3
    assert rate_ceiling(LinearDevice(), requests, 16, 8, 35).batch == 3


def test_a_numpy_load_is_set_as_a_plain_float():
    import numpy as np

    from pipeline.plan.probes import LoadAxis

    cfg = make_config([*SMALL_DEPLOYMENT, "workload.rate=2"])
    value = LoadAxis("workload.rate", 1.0, False, "req/s").value(np.float64(14.5))
    assert type(value) is float
    cfg.workload.rate = value  # a numpy float64 here fails the schema's validation
