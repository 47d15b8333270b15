"""The sweep summary: built from job folders on disk, failed and missing jobs included, and
through the real command line with the basic and the joblib launcher."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.summary import build_summary, main, read_job, swept_keys
from tests.helpers import TINY, markdown_rows, run_cli


def metrics(throughput: float, **extra: Any) -> dict[str, Any]:
    stats = {"mean": 2.0, "p50": 1.0, "p90": 3.0, "p99": 4.0}
    return {
        "status": "ok",
        "output_throughput": throughput,
        "ttft_ms": stats,
        "tpot_ms": stats,
        "itl_ms": stats,
        "e2e_ms": stats,
        "token_utilization": 0.5,
        "num_preemptions": 0,
        "bucket_misses": 1,
        **extra,
    }


def make_job(sweep: Path, num: int, overrides: list[str], job_metrics: dict | None) -> Path:
    """A job folder as Hydra and the engine leave it (only the files the summary reads)."""
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    if job_metrics is not None:
        (job / "metrics.json").write_text(json.dumps(job_metrics))
    return job


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_summary_lists_every_job_with_its_status(tmp_path):
    make_job(tmp_path, 0, ["max_tokens=256", "seed=1"], metrics(100.0))
    make_job(tmp_path, 1, ["max_tokens=512", "seed=1"], {"status": "failed", "error": "boom"})
    make_job(tmp_path, 2, ["max_tokens=1024", "seed=1"], None)

    assert build_summary(tmp_path) == tmp_path / "summary.md"

    rows = read_csv(tmp_path / "summary.csv")
    assert [(r["job"], r["status"]) for r in rows] == [
        ("0", "ok"),
        ("1", "failed"),
        ("2", "interrupted"),  # no metrics.json: killed before it wrote one
    ]
    assert rows[0]["overrides"] == "max_tokens=256 seed=1"
    assert float(rows[0]["output_throughput"]) == 100.0
    assert float(rows[0]["ttft_p99_ms"]) == 4.0 and float(rows[0]["tpot_mean_ms"]) == 2.0
    assert rows[1]["output_throughput"] == "" and rows[1]["error"] == "boom"

    md = (tmp_path / "summary.md").read_text()
    assert "Swept: `max_tokens`" in md and "`seed=1`" in md
    job = next(r for r in markdown_rows(md) if r["job"] == "1")
    assert job["overrides"] == "`max_tokens=512`" and job["status"] == "failed"
    assert "job 1 (failed): boom" in md and "job 2 (interrupted)" in md
    assert (tmp_path / "summary.png").stat().st_size > 10_000


def test_jobs_are_ordered_by_number_not_by_name(tmp_path):
    for num in (10, 2, 1):
        make_job(tmp_path, num, [f"max_tokens={num * 64}"], metrics(float(num)))
    build_summary(tmp_path)
    assert [r["job"] for r in read_csv(tmp_path / "summary.csv")] == ["1", "2", "10"]


def test_categorical_and_two_key_sweeps_plot(tmp_path):
    grid = [(s, b) for s in ("chunked", "whole") for b in (16, 64)]
    for num, (scheduler, block) in enumerate(grid):
        make_job(tmp_path, num, [f"scheduler={scheduler}", f"block_size={block}"], metrics(1.0))
    build_summary(tmp_path)
    assert len(read_csv(tmp_path / "summary.csv")) == 4
    assert (tmp_path / "summary.png").is_file()


def test_swept_key_is_the_one_that_varies(tmp_path):
    jobs = [
        make_job(tmp_path, 0, ["a=1", "b=x"], metrics(1.0)),
        make_job(tmp_path, 1, ["a=1", "b=y"], metrics(1.0)),
    ]
    assert swept_keys([read_job(j) for j in jobs]) == ["b"]


def test_cli_on_a_folder_without_jobs_exits_2(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no job folders" in err and err.count("\n") == 1
    assert main([str(tmp_path / "nowhere")]) == 2


def pipeline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli(tmp_path, "pipeline", *args)


@pytest.mark.slow
def test_real_multirun_with_a_failing_job(tmp_path):
    sweep = tmp_path / "sweep"
    # max_tokens=2 is below max_num_seqs=4: that job fails at start, the others run.
    result = pipeline(tmp_path, "-m", f"hydra.sweep.dir={sweep}", "max_tokens=32,64,2", *TINY)
    assert result.returncode == 0, result.stderr

    rows = read_csv(sweep / "summary.csv")
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert rows[2]["overrides"].startswith("max_tokens=2 ")
    assert "max_num_seqs" in rows[2]["error"]
    assert all(float(r["output_throughput"]) > 0 for r in rows[:2])
    assert (sweep / "summary.png").stat().st_size > 10_000
    page = (sweep / "report.html").read_text()  # every job's row, the failed one's error too
    assert all(f'id="job-{num}"' in page for num in range(3)) and "max_num_seqs" in page
    job = next(r for r in markdown_rows((sweep / "summary.md").read_text()) if r["job"] == "2")
    assert job["overrides"] == "`max_tokens=2`" and job["status"] == "failed"


@pytest.mark.slow
def test_sweep_with_the_joblib_launcher(tmp_path):
    sweep = tmp_path / "sweep"
    result = pipeline(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
        "max_tokens=32,64",
        *TINY,
    )
    assert result.returncode == 0, result.stderr
    rows = read_csv(sweep / "summary.csv")
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok")]
    for num in (0, 1):  # each worker's job logs to its own folder, tagged with its own number
        lines = [
            json.loads(s) for s in (sweep / str(num) / "pipeline.log").read_text().split("\n") if s
        ]
        assert {line.get("job") for line in lines if "job" in line} == {num}
    assert (sweep / "summary.png").is_file()


def test_p90_beside_p50_and_p99_and_clipped_prompts_named(tmp_path):
    make_job(tmp_path, 0, ["max_tokens=256"], metrics(1.0))
    clipped = metrics(2.0, workload_counts={"clipped": 3, "rejected": 0})
    make_job(tmp_path, 1, ["max_tokens=512"], clipped)
    build_summary(tmp_path)
    row = read_csv(tmp_path / "summary.csv")[1]
    for name in ("ttft", "tpot", "itl", "e2e"):
        assert [float(row[f"{name}_{s}_ms"]) for s in ("p50", "p90", "p99")] == [1.0, 3.0, 4.0]
    assert row["clipped"] == "3"
    md = (tmp_path / "summary.md").read_text()
    assert "| ttft_p50_ms | ttft_p90_ms | ttft_p99_ms |" in md
    assert "job 1: 3 prompts clipped" in md


def test_plot_takes_the_numeric_key_on_x_and_leaves_out_empty_panels(tmp_path):
    from pipeline.page.axes import log_scale
    from pipeline.summary import find_jobs
    from pipeline.summary.panels import shown_panels, x_key

    for num, (hw, tokens) in enumerate([(h, t) for h in ("gaudi2", "gaudi3") for t in (256, 512)]):
        make_job(tmp_path, num, [f"hardware={hw}", f"max_tokens={tokens}"],
                 metrics(1.0, prefix_cache_hit_rate=0.0))  # fmt: skip
    jobs = find_jobs(tmp_path)
    assert x_key(jobs, ["hardware", "max_tokens"]) == "max_tokens"
    titles = [title for _, title in shown_panels(jobs)]
    assert "Prefix cache hit rate" not in titles  # 0 in every job
    assert "Warmup, predicted" not in titles  # no job predicts warmup
    assert "TTFT p50" in titles and "TTFT p90" in titles  # the unit follows the values
    assert log_scale([50.0, 200_000.0]) and not log_scale([50.0, 4000.0, None])


def lat(p50: float, p90: float) -> dict[str, float]:
    return {"mean": p50, "p50": p50, "p90": p90, "p99": p90}


def test_the_summary_ends_with_one_recommendation_per_objective(tmp_path):
    # by hand: 2048 has the most throughput (1710, 5.6% over 1024's 1620) but a TTFT p90
    # of 1.5 s, 67% above 1024's 0.9 s, and a TPOT p90 of 50 ms, 43% above 512's 35 ms
    figures = {512: (1200.0, 4000.0, 35.0), 1024: (1620.0, 900.0, 40.0),
               2048: (1710.0, 1500.0, 50.0)}  # fmt: skip
    for num, (tokens, (rate, ttft, tpot)) in enumerate(figures.items()):
        extra = {"ttft_ms": lat(ttft / 2, ttft), "tpot_ms": lat(tpot, tpot)}
        make_job(tmp_path, num, [f"max_tokens={tokens}"], metrics(rate, **extra))
    text = build_summary(tmp_path).read_text()
    advice = text.split("## Recommendation")[1].strip().splitlines()
    assert advice[0].startswith("- max_tokens=2048: highest throughput (1,710.0 tok/s), 6% ahead")
    assert advice[0].endswith("gives up ttft_p90 67% above the best, tpot_p90 43% above the best")
    assert advice[1].startswith("- max_tokens=1024: lowest TTFT p90 (900.0 ms)")
    assert advice[2].startswith("- max_tokens=512: lowest TPOT p90 (35.0 ms)")
    assert len(advice) == 3  # no SLO: no goodput line
    assert text.rstrip().splitlines()[-1] == advice[-1]  # it ends the summary


def test_no_slo_figures_without_an_slo_and_arrival_bound_runs_said(tmp_path):
    for num, rate in enumerate((514.0, 514.2)):
        make_job(tmp_path, num, [f"max_tokens={256 * (num + 1)}"],
                 metrics(rate, slo={"attainment": 0.9}, slo_met=True, slo_attainment=1.0,
                         request_goodput=3.0))  # fmt: skip
    text = build_summary(tmp_path).read_text()
    assert "slo_attainment" not in text and "request_goodput" not in text
    assert "slo_attainment" not in read_csv(tmp_path / "summary.csv")[0]
    assert "arrival-bound jobs 0, 1" in text and "is a tie within 1%" in text


def test_plot_units_and_spread():
    from pipeline.page.axes import spread
    from pipeline.summary.panels import time_unit

    assert time_unit([30.0, 90.0]) == ("s", 1.0)
    assert time_unit([300.0]) == ("min", 60.0)
    assert time_unit([348_650.0, None]) == ("h", 3600.0)
    assert spread([513.8, 514.2]) == pytest.approx(0.4 / 514.2)
    assert spread([None, 5.0]) is None


def test_a_block_size_sweep_on_a_simulated_profile_gets_a_caveat(tmp_path):
    for num, bs in enumerate((64, 128)):
        make_job(tmp_path, num, [f"block_size={bs}"], metrics(100.0 * (num + 1), simulated=True))
    assert "no per-block cost" in build_summary(tmp_path).read_text()


def test_a_swept_key_that_changes_outputs_is_said(tmp_path):
    for num, theta in enumerate((10000, 500000)):
        make_job(tmp_path, num, [f"model.rope_theta={theta}"], metrics(100.0 + num))
    assert "model.rope_theta changes outputs" in build_summary(tmp_path).read_text()


def test_a_latency_tie_goes_to_the_higher_throughput(tmp_path):
    # TTFT p90 900 and 905 ms tie within 1%; 1024 serves 1620 tok/s against 512's 1200
    for num, (tokens, rate, ttft) in enumerate(((512, 1200.0, 900.0), (1024, 1620.0, 905.0))):
        make_job(tmp_path, num, [f"max_tokens={tokens}"],
                 metrics(rate, ttft_ms=lat(ttft / 2, ttft)))  # fmt: skip
    advice = build_summary(tmp_path).read_text().split("## Recommendation")[1]
    assert "- max_tokens=1024: lowest TTFT p90 is a tie within 1% across 2 values" in advice
    assert "of those, the highest throughput" in advice


def test_a_damaged_steps_file_leaves_the_busy_share_unknown(tmp_path):
    """A steps.jsonl line that is no object (a damaged file) is the busy share unknown, not
    a traceback in the summary."""
    from pipeline.summary.jobs import busy_fraction

    (tmp_path / "steps.jsonl").write_text("null\n", encoding="utf-8")
    assert busy_fraction(tmp_path, {"duration_s": 1.0}) is None
