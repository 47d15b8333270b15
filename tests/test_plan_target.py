"""A plan's target load: replicas, cards and headroom by hand, the loop each target needs,
and the check (one replica served at its share of the target, in full) against a plain run."""

from __future__ import annotations

import math

import pytest

from pipeline.config.checks import ConfigError
from pipeline.executors import build_engine
from pipeline.job.slo import Slo, slo_metrics
from pipeline.plan.capacity import capacity_search
from pipeline.plan.target import check_load, check_target, sizing, target_of
from tests.helpers import make_config
from tests.test_capacity import SMALL_DEPLOYMENT


@pytest.mark.parametrize(
    "target, capacity, tp, replicas, cards, headroom",
    [
        (20.0, 6.1, 1, 4, 4, 4 * 6.1 / 20 - 1),  # 3.28 -> 4
        (20.0, 5.0, 2, 4, 8, 0.0),  # exactly 4: no fifth replica by rounding
        (20.0, 25.0, 4, 1, 4, 0.25),  # one replica is enough
        (12.0, 2.9, 1, 5, 5, 5 * 2.9 / 12 - 1),
    ],
)
def test_sizing_by_hand(target, capacity, tp, replicas, cards, headroom):
    size = sizing(target, capacity, tp)
    assert (size.replicas, size.cards) == (replicas, cards)
    assert size.headroom == pytest.approx(headroom)
    more = sizing(target, capacity, tp, extra=1)
    assert (more.replicas, more.cards) == (replicas + 1, (replicas + 1) * tp)


def test_the_check_load_is_the_replicas_share_in_the_axis_unit():
    rate = {"capacity_key": "workload.rate", "capacity": 6.0, "capacity_rps": 5.8}
    assert check_load(rate, 20 / 4) == 5.0
    # a trace: capacity 3x its own rate at 6 req/s, so its own rate is 2 req/s; 5 req/s is 2.5x
    trace = {"capacity_key": "workload.time_scale", "capacity": 3.0, "capacity_rps": 6.0}
    assert check_load(trace, 5.0) == pytest.approx(2.5)
    closed = {"capacity_key": "workload.concurrency", "capacity": 7, "capacity_rps": 3.0}
    assert check_load(closed, 20 / 3) == 7.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["plan.target_concurrency=8"], "set workload.concurrency"),
        (["workload.concurrency=4", "plan.target_rps=5"], "drop workload.concurrency"),
        (["plan.target_rps=5", "plan.target_concurrency=8"], "not both"),
    ],
)
def test_a_target_must_fit_the_loop(overrides, message):
    with pytest.raises(ConfigError, match=message):
        target_of(make_config([*SMALL_DEPLOYMENT, *overrides]))


def attainment_when_served(cfg, rate: float) -> float:
    """A plain, complete run of one replica at `rate`: the independent check."""
    cfg = cfg.copy()
    cfg.workload.rate = rate
    engine, requests = build_engine(cfg)
    engine.warmup()
    duration = engine.run(requests)
    return slo_metrics(requests, duration, Slo.of(cfg.slo))["slo_attainment"]


def test_one_replica_at_its_share_meets_the_slo(tmp_path):
    cfg = make_config([*SMALL_DEPLOYMENT, "workload.rate=2", "plan.target_rps=7"])
    result = capacity_search(cfg, tmp_path)
    assert result["capacity_found"]
    result = check_target(cfg, tmp_path, result)
    target = result["target"]
    replicas = math.ceil(7 / result["capacity"])
    assert target["replicas"] in (replicas, replicas + 1)
    assert target["replica_added"] == (target["replicas"] == replicas + 1)
    assert target["cards"] == target["replicas"] * cfg.tp
    assert target["headroom"] == pytest.approx(target["replicas"] * result["capacity"] / 7 - 1)
    share = 7 / target["replicas"]
    assert target["checks"][-1]["load"] == pytest.approx(share)
    served = attainment_when_served(cfg, share)
    assert served == pytest.approx(target["check_attainment"])
    assert target["check_met"] == (served >= cfg.slo.attainment)
    assert (tmp_path / target["checks"][-1]["folder"] / "metrics.json").is_file()


@pytest.mark.slow
def test_a_plan_across_devices_sizes_each_and_writes_each_devices_commands(tmp_path):
    import csv
    import json

    from tests.helpers import run_cli

    sweep = tmp_path / "plan"
    done = run_cli(
        tmp_path, "pipeline.plan", "model=spec/llama31_8b", "hardware=h100,gaudi3",
        "plan.target_rps=6", "plan.prices.h100=3.0", "plan.prices.gaudi3=2.0",
        "max_model_len=1024", "max_num_seqs=16", "max_tokens=512",
        "workload.num_requests=40", "workload.max_prompt_tokens=600", "workload.rate=2",
        "workload.max_new_tokens=40", "slo.ttft_ms=1000", "slo.tpot_ms=50",
        "capacity.max_probes=6", "capacity.tolerance=0.2", "capacity.sustained=true",
        "capacity.min_requests=40",
        "capacity.turnover=2",
        f"hydra.sweep.dir={sweep}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["device"]: r for r in csv.DictReader(open(sweep / "plan.csv"))}
    for r in rows.values():  # the check served 3 x the requests of the probe at capacity
        metrics = json.loads((sweep / r["job"] / "metrics.json").read_text())
        assert metrics["target"]["checks"][-1]["requests"] == 3 * metrics["num_requests"]
    assert set(rows) == {"h100", "gaudi3"}
    for device, price in (("h100", 3.0), ("gaudi3", 2.0)):
        r = rows[device]
        # the lower of the rate asked and the rate the probe's arrivals came at (target.py)
        capacity = min(float(r["capacity"]), float(r["capacity_rps"]))
        replicas = int(r["replicas"])
        assert replicas in (math.ceil(6 / capacity), math.ceil(6 / capacity) + 1)
        assert float(r["usd_per_hour"]) == replicas * int(r["tp"]) * price
        assert float(r["check_attainment"]) >= 0.9
    assert float(rows["gaudi3"]["warmup_s"]) <= 3600
    # (no FastDeploy script: its supported-model list has no Llama, conf/engine/fastdeploy.yaml)
    assert sorted(p.name for p in (sweep / "deploy" / "h100").glob("*.sh")) == [
        "sglang.sh", "trtllm.sh", "vllm-cuda.sh"]  # fmt: skip
    assert (sweep / "deploy" / "gaudi3" / "vllm-gaudi.sh").is_file()
    assert set(json.loads((sweep / "best.json").read_text())["per_device"]) == {"h100", "gaudi3"}


def test_a_closed_loop_target_is_sized_in_requests_in_flight(tmp_path):
    cfg = make_config([*SMALL_DEPLOYMENT, "workload.concurrency=2", "plan.target_concurrency=9"])
    result = capacity_search(cfg, tmp_path)
    assert result["capacity_found"]
    target = check_target(cfg, tmp_path, result)["target"]
    capacity = result["capacity"]  # requests in flight one replica holds within the SLO
    assert target["unit"] == "concurrency"
    assert target["replicas"] in (math.ceil(9 / capacity), math.ceil(9 / capacity) + 1)
    # one replica holds its share of the 9 in flight, rounded up
    assert target["checks"][-1]["load"] == math.ceil(9 / target["replicas"])


@pytest.mark.slow
def test_the_plan_help_names_the_target_and_the_prices(tmp_path):
    from tests.helpers import run_cli

    done = run_cli(tmp_path, "pipeline.plan", "--help")
    assert done.returncode == 0, done.stderr[-1000:]
    for key in ("plan.target_rps", "plan.target_concurrency", "plan.prices.DEVICE", "$/hour"):
        assert key in done.stdout
