"""SLOs and goodput: vLLM's definitions on hand-computed timelines, and a run's metrics."""

from __future__ import annotations

import pytest

from pipeline.executors import build_engine
from pipeline.job.console import summary_table
from pipeline.job.run import run_requests
from pipeline.job.slo import Slo, slo_metrics
from pipeline.review import metrics_table, trap_notes
from pipeline.summary import Job, write_markdown
from stages.scheduling.request import Request
from tests.helpers import make_config


def timeline(rid: str, arrival: float, token_times: list[float]) -> Request:
    r = Request(rid, 0, "", [1, 2, 3], len(token_times), arrival_s=arrival)
    for t in token_times:
        r.append_token(7, t, None)
    r.finish("length", token_times[-1])
    return r


@pytest.fixture()
def requests() -> list[Request]:
    failed = Request("e", 4, "", [1], 4, arrival_s=0.0)
    failed.fail("too long", 0.5)
    return [
        timeline("a", 0.0, [0.05, 0.06, 0.07]),  # TTFT 50, TPOT 10, E2E 70: good
        timeline("b", 1.0, [1.2, 1.21]),  # TTFT 200 (misses), TPOT 10, E2E 210
        timeline("c", 0.0, [0.1]),  # TTFT 100 (the bound itself: met), one token: TPOT 0
        timeline("d", 0.0, [0.01, 0.11, 0.21]),  # TTFT 10, TPOT 100 (misses), E2E 210
        failed,  # never good
    ]


def test_goodput_and_attainment_by_hand(requests):
    got = slo_metrics(requests, 10.0, Slo(ttft_ms=100, tpot_ms=20))
    assert got["request_goodput"] == pytest.approx(2 / 10)  # a and c in 10 s
    assert got["slo_attainment"] == pytest.approx(2 / 5)
    assert got["slo_attainment_by_bound"] == pytest.approx({"ttft_ms": 3 / 5, "tpot_ms": 3 / 5})
    assert got["slo"] == {"ttft_ms": 100, "tpot_ms": 20, "attainment": 0.9}
    assert got["slo_met"] is False
    assert slo_metrics(requests, 10.0, Slo(ttft_ms=100, tpot_ms=20, attainment=0.4))["slo_met"]


def test_an_e2e_bound_alone_and_no_bound(requests):
    e2e = slo_metrics(requests, 4.0, Slo(e2e_ms=150))
    assert e2e["slo_attainment"] == pytest.approx(2 / 5)  # a (70 ms) and c (100 ms)
    assert e2e["request_goodput"] == pytest.approx(2 / 4)
    # no bound: no SLO figure at all (nothing to attain), the target alone
    assert slo_metrics(requests, 4.0, Slo()) == {"slo": {"attainment": 0.9}}


@pytest.mark.parametrize(
    "values",
    [{"ttft_ms": -1.0}, {"attainment": 0.0}, {"attainment": 1.5}, {"e2e_ms": float("nan")}],
)
def test_impossible_bounds_are_refused(values):
    with pytest.raises(ValueError, match="slo\\."):
        Slo(**values)


def test_a_run_reports_goodput_and_shows_it(tmp_path, capsys):
    cfg = make_config(
        ["executor=simulated", "hardware=gaudi3", "slo.ttft_ms=100000", "slo.tpot_ms=100000"]
    )
    metrics = serve_run_folder(cfg, tmp_path)
    assert metrics["slo_attainment"] == 1.0  # bounds no simulated request comes near
    assert metrics["request_goodput"] == pytest.approx(
        metrics["num_requests"] / metrics["duration_s"]
    )
    table = summary_table(metrics)
    assert "SLO attainment" in table and "goodput" in table
    # warmup=false: every shape compiled while serving, each at the profile's recompile_s
    assert metrics["serving_compiles"] > 0
    assert metrics["serving_compile_s"] == pytest.approx(
        metrics["serving_compiles"] * cfg.hardware.recompile_s
    )
    assert "compiles while serving" in table


def serve_run_folder(cfg, out_dir):
    engine, requests = build_engine(cfg)
    return run_requests(cfg, engine, requests, out_dir)


def test_review_and_summary_say_what_compiled_while_serving_and_missed_the_slo(tmp_path):
    a = {"status": "ok", "serving_compiles": 0, "slo_met": True, "slo_attainment": 0.95,
         "slo": {"ttft_ms": 100, "attainment": 0.9}, "request_goodput": 2.0}  # fmt: skip
    b = {**a, "serving_compiles": 36, "serving_compile_s": 360.0, "slo_met": False,
         "slo_attainment": 0.5}  # fmt: skip
    notes = "\n".join(trap_notes(metrics_table(a, b)))
    assert "B compiled 36 graphs while serving (360.0 s predicted)" in notes
    assert "B missed its SLO (0.5 < 0.9)" in notes and "A " not in notes
    jobs = [
        Job(0, tmp_path / "0", ["seed=0"], "ok", a),
        Job(1, tmp_path / "1", ["seed=1"], "ok", b),
    ]
    write_markdown(jobs, ["seed"], tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    assert "job 1: 36 graphs compiled while serving, 360.0 s predicted" in text
    assert "job 0:" not in text.split("compiled while serving")[-1]
    assert "slo_attainment" in text and "request_goodput" in text
