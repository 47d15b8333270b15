"""A plan that sweeps ep and dp: the combinations the engines cannot deploy (ep is 1 or
tp x dp) are ruled out with the reason and never searched; the others count tp x dp cards and
dp replicas' capacity."""

from __future__ import annotations

import csv
import json

import pytest

from pipeline.command import Job
from pipeline.config.checks import ConfigError
from pipeline.plan import layout_rule, plan_job
from pipeline.plan.candidates import read_candidates
from pipeline.summary import find_jobs
from tests.helpers import make_config, run_cli


def test_an_ep_dp_sweep_rules_out_the_constraint_breaking_rows(tmp_path):
    sweep = tmp_path / "plan"
    done = run_cli(
        tmp_path, "pipeline.plan", "model=spec/qwen3_30b_a3b", "hardware=h100",
        "tp=1", "dp=1,2", "ep=1,2", "max_model_len=1024", "max_num_seqs=8", "max_tokens=512",
        "workload.num_requests=16", "workload.min_prompt_tokens=100",
        "workload.max_prompt_tokens=300", "workload.min_new_tokens=10",
        "workload.max_new_tokens=20", "workload.rate=2", "slo.ttft_ms=2000", "slo.tpot_ms=100",
        "capacity.max_probes=3", "capacity.tolerance=0.3", "plan.target_rps=300",
        "capacity.sustained=false",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["config"]): r for r in csv.DictReader(open(sweep / "plan.csv"))}
    by_job = {int(r["job"]): r for r in rows.values()}
    assert len(by_job) == 4
    for r in by_job.values():
        jobs_metrics = json.loads((sweep / r["job"] / "metrics.json").read_text())
        dp, ep = int(r["config"].split("dp=")[1][0]), int(r["config"].split("ep=")[1][0])
        if ep not in (1, dp) or (ep == 1 and dp > 1):  # ep must be 1 or tp x dp = dp
            assert r["rank"] == "" and r["note"].startswith("layout: ")
            assert "capacity_key" not in jobs_metrics  # never searched
            continue
        assert r["rank"] != ""
        # cards per replica = tp x dp = dp; one replica serves dp simulated replicas' load
        assert int(r["replica_cards"]) == dp
        assert float(r["capacity_rps"]) == jobs_metrics["capacity_rps"] * dp
        assert int(r["cards"]) == int(r["replicas"]) * dp
        assert r["ep_dp"] == ("-" if dp == 1 else f"{ep}/{dp}")


def test_a_job_that_fails_its_checks_still_shows_its_device_and_layout(tmp_path):
    """A configuration the search refuses (here an empty prefill pool) is a row of the plan
    with its device, tp and P:D, not a row of dashes."""
    cfg = make_config(
        ["executor=simulated", "hardware=h100", "model=spec/llama31_8b", "tp=2",
         "disagg.decode=2", "slo.ttft_ms=500"]
    )  # fmt: skip
    job = Job(out_dir=tmp_path / "0", multirun=True, num=0, choices={}, overrides=[])
    (job.out_dir / ".hydra").mkdir(parents=True)  # as Hydra leaves a job's folder
    (job.out_dir / ".hydra" / "overrides.yaml").write_text("- disagg.decode=2\n")
    with pytest.raises(ConfigError, match="needs instances in both pools"):
        plan_job(cfg, job)
    (candidate,) = read_candidates(find_jobs(tmp_path), max_warmup_s=0.0)
    assert (candidate.device, candidate.tp, candidate.layout.decode) == ("h100", 2, 2)


def test_a_disaggregated_deployment_is_ruled_out_by_its_pools_layouts():
    moe = ["executor=simulated", "hardware=h100", "model=spec/qwen3_30b_a3b", "tp=1", "dp=2",
           "ep=2", "disagg.prefill=1", "disagg.decode=1", "slo.ttft_ms=500"]  # fmt: skip
    assert layout_rule(make_config(moe)) == ""  # searched: each pool EP over its tp x dp
    assert layout_rule(make_config([*moe, "disagg.decode_dp=3"])).startswith(
        "layout: decode pool (disagg.decode_dp=3, tp=1): ep=3 does not divide"
    )
    assert "ep=4 must equal tp x dp" in layout_rule(make_config([*moe, "ep=4"]))
