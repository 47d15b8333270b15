"""The plan: ranking by goodput per card or cost, the Pareto front, rules (warmup limit,
compiles while serving), and `python -m pipeline.plan` end to end."""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.deploy import main as deploy_main
from pipeline.plan.candidates import pareto_front, rank, read_candidates
from pipeline.plan.report import build_plan_report, check_plan
from pipeline.summary import find_jobs
from tests.helpers import make_config, run_cli


@functools.cache
def resolved(device: str = "gaudi2") -> dict:
    """A real composed config, resolved, as a job folder holds it: in FP8, the precision the
    devices' published rows were measured in (no unchecked precision in its band)."""
    cfg = make_config(["executor=simulated", f"hardware={device}", "model=spec/llama31_8b",
                       "quantization=fp8"])  # fmt: skip
    return yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))


def make_job(plan: Path, num: int, tp: int, goodput: float, tokens: float, tpot_ms: float,
             warmup_s: float = 10.0, compiles: int = 0, found: bool = True,
             device: str = "gaudi2", band: float = 0.0, target: dict | None = None,
             blocks: int = 100) -> None:  # fmt: skip
    """A job folder; `band`: the profile's held-out median error (0: no band)."""
    folder = plan / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"tp={tp}", f"seed={num}"]))
    metrics = {
        "status": "ok", "capacity_found": found, "capacity": 1.0, "capacity_rps": goodput,
        "request_goodput": goodput, "output_throughput": tokens, "tpot_ms": {"mean": tpot_ms},
        "slo_attainment": 0.95,
        "predicted_warmup_s": warmup_s, "serving_compiles": compiles, "num_blocks": blocks,
    }  # fmt: skip
    if target:
        metrics["target"] = target
    (folder / "metrics.json").write_text(json.dumps(metrics))
    config = resolved(device)
    errors = {"static": {"held_out_median": band}} if band else {}
    hardware = {**config["hardware"], "errors": errors}
    (folder / "resolved_config.yaml").write_text(
        yaml.safe_dump({**config, "tp": tp, "hardware": hardware})
    )


@pytest.fixture()
def plan(tmp_path) -> Path:
    make_job(tmp_path, 0, tp=1, goodput=4.0, tokens=1000, tpot_ms=20)  # 4/card, 50 tok/s/user
    make_job(tmp_path, 1, tp=2, goodput=10.0, tokens=3000, tpot_ms=40)  # 5/card, 1500/card, 25
    make_job(tmp_path, 2, tp=1, goodput=3.0, tokens=900, tpot_ms=25)  # beaten by job 0 on both
    make_job(tmp_path, 3, tp=1, goodput=9.0, tokens=2000, tpot_ms=10, warmup_s=5000)
    make_job(tmp_path, 4, tp=1, goodput=8.0, tokens=9000, tpot_ms=5, found=False)
    return tmp_path


def best(cands, objective, prices):
    return rank(cands, objective, prices).order[0]


def test_ranking_front_and_rules_by_hand(plan):
    cands = read_candidates(find_jobs(plan), max_warmup_s=600)
    ruled = {c.job.num: c.ruled_out for c in cands}
    assert "plan.max_warmup_s" in ruled[3] and "no load met" in ruled[4]
    assert not ruled[0] and not ruled[1] and not ruled[2]
    # goodput per card = capacity_rps x attainment (0.95) / tp: 9.5 / 2 = 4.75 > 3.8 > 2.85
    assert best(cands, "goodput_per_card", {}).job.num == 1
    assert cands[1].goodput_per_card == pytest.approx(10.0 * 0.95 / 2)
    # cost per Mtok at $2/card-hour: job 0 2/(1000*3600)*1e6 = 0.556; job 1 4/(3000*3600)*1e6
    # = 0.370; job 2 0.617
    chosen = best(cands, "cost", {"gaudi2": 2.0})
    assert chosen.job.num == 1
    assert chosen.cost_per_mtok({"gaudi2": 2.0}) == pytest.approx(4 / (3000 * 3600) * 1e6)
    assert [c.job.num for c in pareto_front(cands)] == [1, 0]  # by tokens/s per user
    everyone = read_candidates(find_jobs(plan), max_warmup_s=0)
    assert best(everyone, "goodput_per_card", {}).job.num == 3  # no warmup limit: 9/card


def test_a_run_that_compiled_while_serving_is_flagged(plan):
    make_job(plan, 5, tp=1, goodput=20.0, tokens=4000, tpot_ms=10, compiles=7)
    text = build_plan_report(plan, {"objective": "goodput_per_card", "prices": {},
                                    "max_warmup_s": 600, "model_id": ""})  # fmt: skip
    rows = {r["job"]: r for r in csv.DictReader(open(plan / "plan.csv"))}
    assert "compiled 7 graphs while serving" in rows["5"]["note"]
    assert "note: it compiled 7 graphs while serving" in text


@pytest.mark.slow
def test_plan_command_writes_the_table_plot_best_and_deploy_files(tmp_path):
    sweep = tmp_path / "plan"
    done = run_cli(
        tmp_path, "pipeline.plan", "model=spec/llama31_8b", "hardware=gaudi2",
        "max_model_len=1024", "max_num_seqs=8", "max_tokens=256,512",
        "workload.num_requests=12", "workload.max_prompt_tokens=400",
        "workload.max_new_tokens=20", "slo.ttft_ms=500", "slo.tpot_ms=40",
        "capacity.max_probes=4", "capacity.tolerance=0.5", "capacity.sustained=false",
        "plan.model_id=org/planned",
        f"hydra.sweep.dir={sweep}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("plan.md", "plan.csv", "pareto.png", "best.json", "summary.md", "report.html"):
        assert (sweep / name).is_file(), name
    assert "<title>Plan " in (sweep / "report.html").read_text()  # the plan's, not the sweep's
    for name in ("vllm-gaudi.sh", "overrides.txt"):
        assert (sweep / "deploy" / "gaudi2" / name).is_file(), name
    # FastDeploy's Intel Gaudi guide serves ERNIE 4.5 only (conf/engine/fastdeploy.yaml)
    assert not (sweep / "deploy" / "gaudi2" / "fastdeploy-hpu.sh").exists()
    rows = list(csv.DictReader(open(sweep / "plan.csv")))
    assert len(rows) == 2
    chosen = json.loads((sweep / "best.json").read_text())
    top = max(rows, key=lambda r: float(r["goodput_per_card"] or 0))
    # the most goodput per card, or a configuration tied with it within the bands
    assert str(chosen["job"]) == top["job"] or int(top["job"]) in chosen["tied"]
    assert [r["rank"] for r in rows if r["job"] == str(chosen["job"])] == ["1"]
    assert f"best by goodput_per_card: job {chosen['job']}" in done.stdout
    assert "--max-num-batched-tokens" in (sweep / "deploy/gaudi2/vllm-gaudi.sh").read_text()
    # any job the user names: python -m pipeline.deploy JOB_DIR
    other = 1 - int(chosen["job"])
    assert deploy_main([str(sweep / str(other)), "--model", "org/m"]) == 0
    script = (sweep / str(other) / "deploy" / "vllm-gaudi.sh").read_text()
    budget = {r["job"]: r for r in rows}[str(other)]["config"].removeprefix("max_tokens=")
    assert "vllm serve org/m" in script and f"--max-num-batched-tokens {budget}" in script
    # without --model: the model id the plan recorded
    assert deploy_main([str(sweep / str(other)), "--out", str(tmp_path / "again")]) == 0
    assert "vllm serve org/planned" in (tmp_path / "again" / "vllm-gaudi.sh").read_text()
    # ready_s: the weights' load (16 GB of bf16 at 1 GB/s) and the buckets' compile
    ready = {r["job"]: float(r["ready_s"]) for r in rows}
    warmup = {r["job"]: float(r["warmup_s"]) for r in rows}
    assert all(ready[j] > warmup[j] + 15 for j in ready)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["slo.ttft_ms=0"], "needs an SLO"),
        (["slo.tpot_ms=50", "plan.prices.h100=-1"], "plan.prices.h100=-1"),
        (["slo.tpot_ms=-5"], "slo.tpot_ms=-5"),
    ],
)
def test_plan_keys_are_checked_before_any_job(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_plan(make_config(overrides))
