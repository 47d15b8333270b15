"""A plan across devices at a target load: $/hour by hand, a missing price said and ranked
by cards, the order by the central figure alone (a tie within bands or the search tolerance
marked, never moving a row; equal figures to more headroom, more KV memory, shorter
readiness), and every predicted figure with its band in plan.csv and plan.md."""

from __future__ import annotations

import csv
import json

import pytest

from pipeline.plan.candidates import rank, read_candidates
from pipeline.plan.report import build_plan_report
from pipeline.summary import find_jobs
from tests.test_plan import make_job


def sized(target: float, capacity: float, replicas: int, tp: int) -> dict:
    return {"target": target, "capacity": capacity, "replicas": replicas, "tp": tp,
            "cards": replicas * tp, "headroom": replicas * capacity / target - 1,
            "check_met": True, "check_attainment": 0.95, "unit": "req/s"}  # fmt: skip


@pytest.fixture()
def devices(tmp_path):
    # 20 req/s. h100 tp1 at 6 req/s: 4 replicas, 4 cards; gaudi3 tp1 at 4.2: 5 replicas.
    make_job(tmp_path, 0, tp=1, goodput=6.0, tokens=3000, tpot_ms=20, device="h100",
             target=sized(20, 6.0, 4, 1))  # fmt: skip
    make_job(tmp_path, 1, tp=1, goodput=4.2, tokens=2000, tpot_ms=25, device="gaudi3",
             target=sized(20, 4.2, 5, 1))  # fmt: skip
    make_job(tmp_path, 2, tp=2, goodput=14.0, tokens=6000, tpot_ms=15, device="h100",
             target=sized(20, 14.0, 2, 2))  # fmt: skip
    return tmp_path


def test_cost_at_the_target_by_hand(devices):
    cands = read_candidates(find_jobs(devices), max_warmup_s=3600)
    prices = {"h100": 3.0, "gaudi3": 2.0}
    usd = {c.job.num: c.usd_per_hour(prices) for c in cands}
    assert usd == {0: 4 * 3.0, 1: 5 * 2.0, 2: 4 * 3.0}  # 12, 10, 12
    ranking = rank(cands, "goodput_per_card", prices)
    assert ranking.by == "usd_per_hour"
    assert [c.job.num for c in ranking.order][0] == 1  # $10/h
    # jobs 0 and 2 both $12/h: headroom 2 x 14 / 20 - 1 = +40% before 4 x 6 / 20 - 1 = +20%
    assert [c.job.num for c in ranking.order][1:] == [2, 0]
    assert "job 2 first" in ranking.note and "headroom +40% against +20%" in ranking.note


def test_a_missing_price_is_said_and_cards_ranked_by(devices):
    cands = read_candidates(find_jobs(devices), max_warmup_s=3600)
    ranking = rank(cands, "goodput_per_card", {"h100": 3.0, "gaudi3": 0.0})
    assert ranking.by == "cards"
    assert "no price for gaudi3" in ranking.note and "plan.prices.gaudi3" in ranking.note
    # cards 4, 5, 4: jobs 0 and 2 equal, job 2 has more headroom (+40% against +20%)
    assert [c.job.num for c in ranking.order] == [2, 0, 1]


def test_a_tie_within_the_band_is_marked_and_never_reorders(tmp_path):
    # bands +-10%: 5.0/card (tp 2), 4.8 and 4.7/card (tp 1) overlap; 3.0/card does not
    make_job(tmp_path, 0, tp=2, goodput=10.0 / 0.95, tokens=3000, tpot_ms=20, band=0.1)
    make_job(tmp_path, 1, tp=1, goodput=4.7 / 0.95, tokens=1000, tpot_ms=20, band=0.1,
             warmup_s=50)  # fmt: skip
    make_job(tmp_path, 2, tp=1, goodput=4.8 / 0.95, tokens=1000, tpot_ms=20, band=0.1,
             warmup_s=50, blocks=80)  # fmt: skip
    make_job(tmp_path, 3, tp=1, goodput=3.0 / 0.95, tokens=900, tpot_ms=20, band=0.1)
    cands = read_candidates(find_jobs(tmp_path), max_warmup_s=3600)
    ranking = rank(cands, "goodput_per_card", {})
    assert [c.job.num for c in ranking.order] == [0, 2, 1, 3]  # the central figure alone
    assert [c.job.num for c in ranking.tied] == [0, 2, 1]
    assert "tie: jobs 2, 1" in ranking.note and "stays by the central figure" in ranking.note
    # with no band, only the search tolerance ties: 5.0 vs 4.8 is 4% apart
    for c in cands:
        c.config["hardware"]["errors"] = {}
    assert [c.job.num for c in rank(cands, "goodput_per_card", {}, 0.05).tied] == [0, 2]
    assert [c.job.num for c in rank(cands, "goodput_per_card", {}, 0.01).tied] == [0]


def test_cheapest_first_whatever_its_cards_warmup_or_kv(tmp_path):
    # 40 req/s. h100 tp1 at 21 req/s: 2 replicas, $6/h at $3, warmup 2 s, 900 blocks;
    # gaudi3 tp1 at 11: 4 replicas, $8/h at $2, warmup 1,280 s: the $6/h row leads. At
    # gaudi3 $1.4: $5.6/h, ahead of H100 with more cards and a longer warmup.
    make_job(tmp_path, 0, tp=1, goodput=21.0, tokens=1, tpot_ms=20, device="h100",
             warmup_s=2, blocks=900, target=sized(40, 21.0, 2, 1))  # fmt: skip
    make_job(tmp_path, 1, tp=1, goodput=11.0, tokens=1, tpot_ms=20, device="gaudi3",
             warmup_s=1280, blocks=100, target=sized(40, 11.0, 4, 1))  # fmt: skip
    cands = read_candidates(find_jobs(tmp_path), max_warmup_s=3600)
    assert [c.job.num for c in rank(cands, "cost", {"h100": 3.0, "gaudi3": 2.0}).order] == [0, 1]
    assert [c.job.num for c in rank(cands, "cost", {"h100": 3.0, "gaudi3": 1.4}).order] == [1, 0]


def test_equal_cost_goes_to_kv_memory_then_readiness(tmp_path):
    # same device, price, cards and headroom: more KV blocks first, then the shorter ready_s
    for num, blocks, warmup in ((0, 100, 5.0), (1, 300, 50.0), (2, 300, 20.0)):
        make_job(tmp_path, num, tp=1, goodput=6.0, tokens=1, tpot_ms=20, device="h100",
                 warmup_s=warmup, blocks=blocks, target=sized(20, 6.0, 4, 1))  # fmt: skip
    cands = read_candidates(find_jobs(tmp_path), max_warmup_s=3600)
    ranking = rank(cands, "cost", {"h100": 3.0})
    assert [c.job.num for c in ranking.order] == [2, 1, 0]
    assert "job 2 first" in ranking.note and "ready s 20 against 50" in ranking.note


def test_the_table_carries_bands_and_a_deploy_folder_per_device(devices):
    for num, band in ((0, 0.084), (2, 0.084), (1, 0.2)):
        path = devices / str(num) / "resolved_config.yaml"
        errors = f"errors: {{static: {{held_out_median: {band}}}}}"
        path.write_text(path.read_text().replace("errors: {}", errors))
    prices = {"h100": 3.0, "gaudi3": 2.0}
    settings = {"objective": "goodput_per_card", "max_warmup_s": 3600, "prices": prices}
    build_plan_report(devices, {**settings, "model_id": "m"})
    rows = {r["job"]: r for r in csv.DictReader(open(devices / "plan.csv"))}
    h100 = rows["0"]
    assert float(h100["capacity_lo"]) == pytest.approx(1.0 / 1.084)
    assert float(h100["goodput_per_card_hi"]) == pytest.approx(6.0 * 0.95 * 1.084)
    # $/h band: replicas re-rounded at capacity 6 / 1.084 and 6 x 1.084: ceil(20/5.535) = 4,
    # ceil(20/6.504) = 4: $12-12; gaudi3 at 4.2 / 1.2 and x 1.2: ceil(20/3.5) = 6, ceil(20/5.04) = 4
    assert (float(h100["usd_per_hour_lo"]), float(h100["usd_per_hour_hi"])) == (12.0, 12.0)
    assert (float(rows["1"]["usd_per_hour_lo"]), float(rows["1"]["usd_per_hour_hi"])) == (8.0, 12.0)
    text = (devices / "plan.md").read_text()
    assert "10 (8-12)" in text and "+-8%" in text
    best = json.loads((devices / "best.json").read_text())
    assert set(best["per_device"]) == {"h100", "gaudi3"}
    gaudi = best["per_device"]["gaudi3"]
    assert gaudi["bands"]["usd_per_hour"] == [8.0, 12.0]
    assert gaudi["bands"]["capacity_rps"] == pytest.approx([4.2 / 1.2, 4.2 * 1.2])
    assert (devices / "deploy" / "gaudi3" / "vllm-gaudi.sh").is_file()
    assert (devices / "deploy" / "h100").is_dir()


def test_identical_rows_are_said(tmp_path):
    # two settings the load never reached: the same figures, one answer said twice
    for num in (0, 1):
        make_job(tmp_path, num, tp=1, goodput=6.0, tokens=1, tpot_ms=20, device="h100",
                 target=sized(20, 6.0, 4, 1))  # fmt: skip
    make_job(tmp_path, 2, tp=1, goodput=5.0, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 5.0, 4, 1))  # fmt: skip
    build_plan_report(tmp_path, {"objective": "cost", "max_warmup_s": 3600,
                                 "prices": {"h100": 3.0}, "model_id": "m"})  # fmt: skip
    notes = {r["job"]: r["note"] for r in csv.DictReader(open(tmp_path / "plan.csv"))}
    assert notes["1"] == "same figures as job 0" and notes["0"] == "" and notes["2"] == ""


def test_a_preference_apart_below_the_rounding_is_shown_apart(tmp_path):
    # headroom 4 x 6.001 / 20 - 1 = +20.02% against 4 x 6 / 20 - 1 = +20.00%
    make_job(tmp_path, 0, tp=1, goodput=6.0, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 6.0, 4, 1))  # fmt: skip
    make_job(tmp_path, 1, tp=1, goodput=6.001, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 6.001, 4, 1))  # fmt: skip
    cands = read_candidates(find_jobs(tmp_path), max_warmup_s=3600)
    note = rank(cands, "cost", {"h100": 3.0}).note
    assert "headroom +20.02% against +20.00%" in note
