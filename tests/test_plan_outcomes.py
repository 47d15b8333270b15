"""How a plan ends when it cannot rank: refused for want of an SLO (one line, exit 2, no
summary attempted), or with no configuration meeting the SLO (the summary still built)."""

from __future__ import annotations

import json

from pipeline.summary import build_summary
from tests.helpers import run_cli
from tests.test_plan import make_job


def test_a_plan_refused_for_want_of_an_slo_says_one_line(tmp_path):
    sweep = tmp_path / "plan"
    done = run_cli(tmp_path, "pipeline.plan", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 2
    said = (done.stdout + done.stderr).splitlines()
    assert [line for line in said if line.strip()] == [
        "Error: a plan needs an SLO: give slo.ttft_ms, slo.tpot_ms or slo.e2e_ms"
    ], said


def test_the_summary_of_a_plan_no_configuration_met_is_built(tmp_path):
    """Every job at zero goodput and throughput under an SLO: the recommendation compares
    against a best of 0, and must not divide by it."""
    for num in range(2):
        make_job(tmp_path, num, tp=1 + num, goodput=0.0, tokens=0.0, tpot_ms=20, found=False)
        path = tmp_path / str(num) / "metrics.json"
        metrics = json.loads(path.read_text())
        metrics["slo"] = {"ttft_ms": 1.0, "attainment": 0.99}
        path.write_text(json.dumps(metrics))
    text = build_summary(tmp_path).read_text()
    assert "Recommendation" in text and "highest goodput" in text
