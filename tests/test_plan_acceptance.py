"""No assumed acceptance: a speculative row without a measured acceptance says "acceptance
assumed" (table, best.json, scripts) and ranks after every row that assumes nothing; a
published figure is read from its table with its source."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from pipeline.config.checks import ConfigError
from pipeline.config.compose import compose_config
from pipeline.plan.candidates import rank, read_candidates
from pipeline.plan.report import build_plan_report
from pipeline.speculation.keys import speculation_of
from pipeline.speculation.published_acceptance import TABLE
from pipeline.summary import find_jobs
from tests.test_plan import make_job
from tests.test_plan_ranking import sized


def speculative(folder, source: str = "") -> None:
    path = folder / "resolved_config.yaml"
    config = yaml.safe_load(path.read_text())
    config["speculative"] = {**config["speculative"], "method": "ngram", "tokens": 3,
                             "acceptance_from": source}  # fmt: skip
    path.write_text(yaml.safe_dump(config))


@pytest.fixture()
def jobs(tmp_path):
    # 20 req/s on h100 at $3: job 0 (speculative, assumed) 2 replicas $6/h; job 1 plain, 4
    # replicas $12/h; job 2 speculative with a published acceptance, 3 replicas $9/h
    make_job(tmp_path, 0, tp=1, goodput=10.0, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 10.0, 2, 1))  # fmt: skip
    make_job(tmp_path, 1, tp=1, goodput=5.0, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 5.0, 4, 1))  # fmt: skip
    make_job(tmp_path, 2, tp=1, goodput=7.0, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 7.0, 3, 1))  # fmt: skip
    speculative(tmp_path / "0")
    speculative(tmp_path / "2", "published:GSM8K")
    return tmp_path


def test_an_assumed_acceptance_ranks_last_and_says_so(jobs):
    cands = read_candidates(find_jobs(jobs), max_warmup_s=3600)
    assert [c.acceptance_assumed for c in cands] == [True, False, False]
    assert [c.job.num for c in rank(cands, "cost", {"h100": 3.0}).order] == [2, 1, 0]
    build_plan_report(jobs, {"objective": "cost", "max_warmup_s": 3600,
                             "prices": {"h100": 3.0}, "model_id": "m"})  # fmt: skip
    rows = {r["job"]: r for r in csv.DictReader(open(jobs / "plan.csv"))}
    assert rows["0"]["note"].startswith("acceptance assumed") and rows["0"]["rank"] == "3"
    assert rows["2"]["note"] == "acceptance from published:GSM8K"
    best = json.loads((jobs / "best.json").read_text())
    assert best["job"] == 2 and "acceptance assumed" not in json.dumps(best["row"])


def test_the_scripts_of_an_assumed_row_say_so(tmp_path):
    make_job(tmp_path, 0, tp=1, goodput=10.0, tokens=1, tpot_ms=20, device="h100",
             target=sized(20, 10.0, 2, 1))  # fmt: skip
    speculative(tmp_path / "0")
    build_plan_report(tmp_path, {"objective": "cost", "max_warmup_s": 3600,
                                 "prices": {"h100": 3.0}, "model_id": "m"})  # fmt: skip
    assert "acceptance assumed" in (tmp_path / "deploy/h100/vllm-cuda.sh").read_text()
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["row"]["note"].startswith("acceptance assumed")


def test_a_published_acceptance_is_the_tables_row():
    with open(TABLE, newline="") as f:
        row = next(r for r in csv.DictReader(f)
                   if r["method"] == "ngram" and r["dataset"] == "ShareGPT")  # fmt: skip
    cfg = compose_config(["executor=simulated", "hardware=h100", "model=spec/llama31_8b",
                          "speculative.method=ngram", "speculative.tokens=3",
                          "speculative.acceptance_from=published:ShareGPT"])  # fmt: skip
    found = speculation_of(cfg)
    assert found is not None
    assert list(found.acceptance) == json.loads(row["acceptance"])
    assert found.proposal_rate == float(row["proposal_rate"])
    cfg.speculative.acceptance_from = "published:Nowhere"
    with pytest.raises(ConfigError, match="has no ngram row for Llama-3.1-8B"):
        speculation_of(cfg)
