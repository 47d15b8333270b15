"""`pipeline.review A B` of two plan jobs (config diff, capacity, goodput per card, cost at
the target, by hand) and of two plans (best overall and per device)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from pipeline.plan.report import build_plan_report
from pipeline.review import main
from pipeline.review.plans import handles, review_plan_pair
from tests.test_plan import make_job
from tests.test_plan_ranking import sized


@pytest.fixture()
def jobs(tmp_path):
    make_job(tmp_path, 0, tp=1, goodput=6.0, tokens=3000, tpot_ms=20, device="h100",
             target=sized(20, 6.0, 4, 1))  # fmt: skip
    make_job(tmp_path, 1, tp=2, goodput=9.0, tokens=2000, tpot_ms=25, device="gaudi3",
             target=sized(20, 9.0, 3, 2))  # fmt: skip
    for num, prices in ((0, {"h100": 3.0}), (1, {"gaudi3": 2.0})):
        folder = tmp_path / str(num)
        (folder / "capacity.json").write_text("{}")
        config = yaml.safe_load((folder / "resolved_config.yaml").read_text())
        config["plan"] = {**config.get("plan", {}), "prices": prices}
        (folder / "resolved_config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def test_two_plan_jobs_by_hand(jobs, capsys):
    assert handles(jobs / "0", jobs / "1")
    doc = review_plan_pair(jobs / "0", jobs / "1")
    figures = {r["figure"]: r for r in doc["figures"]}
    # goodput per card = capacity_rps x attainment (0.95) / tp
    assert figures["goodput_per_card"]["a"] == pytest.approx(6.0 * 0.95)
    assert figures["goodput_per_card"]["b"] == pytest.approx(9.0 * 0.95 / 2)
    # $/hour = cards x the job's own price: 4 x 3 and 6 x 2
    assert (figures["usd_per_hour"]["a"], figures["usd_per_hour"]["b"]) == (12.0, 12.0)
    assert figures["cards"]["b"] == 6 and figures["cards"]["ratio"] == 1.5
    changed = doc["config"]["changed"]["hardware.name"]
    assert (changed["a"], changed["b"]) == ("h100", "gaudi3")
    assert main([str(jobs / "0"), str(jobs / "1")]) == 0
    assert "| usd_per_hour | 12 | 12 | 1 |" in capsys.readouterr().out


def test_two_plans(jobs, tmp_path_factory, capsys):
    settings = {"objective": "goodput_per_card", "max_warmup_s": 3600, "model_id": "m",
                "prices": {"h100": 3.0, "gaudi3": 2.0}}  # fmt: skip
    build_plan_report(jobs, settings)
    other = tmp_path_factory.mktemp("b") / "plan"
    shutil.copytree(jobs, other)
    build_plan_report(other, {**settings, "prices": {"h100": 1.0, "gaudi3": 2.0}})
    assert main([str(jobs), str(other), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "plans" and set(doc["per_device"]) == {"h100", "gaudi3"}
    h100 = {r["figure"]: r for r in doc["per_device"]["h100"]["figures"]}
    assert (h100["usd_per_hour"]["a"], h100["usd_per_hour"]["b"]) == (12.0, 4.0)
