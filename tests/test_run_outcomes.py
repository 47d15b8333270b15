"""A batch run says how it went: a run whose every request failed exits 1 and says so (its
metrics.json too), a disaggregated one alike, one where some failed warns in one line;
start-up checks refuse every key they read in one line (exit 2); a workload line too large
to serve is refused before it is read whole."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.__main__ import run_job
from pipeline.command import Job
from tests.helpers import make_config, run_cli

SMALL = ["model=tiny", "max_num_seqs=4", "max_model_len=256", "workload.num_requests=4"]


def job(folder: Path) -> Job:
    return Job(out_dir=folder, multirun=False, num=0, choices={}, overrides=[])


def metrics_of(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


# ------------------------------------------------------------ case 11: all failed


def test_a_run_whose_every_request_failed_exits_1_and_says_so(tmp_path, capsys):
    folder = tmp_path / "run"
    assert run_job(make_config([*SMALL, "num_blocks=1"]), job(folder)) == 1
    metrics = metrics_of(folder)
    assert metrics["status"] == "failed" and metrics["num_errors"] == metrics["num_requests"] == 4
    assert "every request failed (4 of 4" in metrics["error"]
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("Error: ")] == [f"Error: {metrics['error']}"]


def test_a_disaggregated_run_whose_every_request_failed_exits_1_and_says_so(tmp_path, capsys):
    folder = tmp_path / "run"
    simulated = ["executor=simulated", "hardware=h100", "model=spec/llama31_8b", "max_num_seqs=4",
                 "max_model_len=1024", "workload.num_requests=4"]  # fmt: skip
    pools = ["disagg.prefill=1", "disagg.decode=1"]
    assert run_job(make_config([*simulated, *pools, "num_blocks=1"]), job(folder)) == 1
    metrics = metrics_of(folder)
    assert metrics["status"] == "failed" and metrics["num_errors"] == metrics["num_requests"] == 4
    assert "every request failed (4 of 4" in metrics["error"] and "disagg" in metrics
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("Error: ")] == [f"Error: {metrics['error']}"]
    # The same deployment with room for its requests serves them: exit 0.
    assert run_job(make_config([*simulated, *pools]), job(tmp_path / "served")) == 0
    assert metrics_of(tmp_path / "served")["status"] == "ok"


NOISE = random.Random(0).randbytes(20_000)  # seeded: every test worker collects the same


@pytest.mark.parametrize("content", [NOISE, b'{"prompt": ""}\n{"x": 1}\n'])
def test_a_workload_of_nothing_but_bad_lines_fails_the_run(tmp_path, content):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    folder = tmp_path / "run"
    cfg = make_config([*SMALL, "workload=jsonl", f"workload.path={path}"])
    assert run_job(cfg, job(folder)) == 1
    assert metrics_of(folder)["status"] == "failed"


def test_a_run_where_some_requests_failed_warns_and_exits_0(tmp_path, capsys):
    path = tmp_path / "some.jsonl"
    path.write_text('{"prompt": "hello", "max_new_tokens": 2}\nnot json\n')
    folder = tmp_path / "run"
    cfg = make_config([*SMALL, "workload=jsonl", f"workload.path={path}"])
    assert run_job(cfg, job(folder)) == 0
    assert metrics_of(folder)["status"] == "ok"
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("Warning: ")]
    assert len(warnings) == 1 and "some requests failed (1 of 2" in warnings[0]


def test_the_command_exits_1_when_every_request_failed(tmp_path):
    done = run_cli(tmp_path, "pipeline", *SMALL, "num_blocks=1", f"hydra.run.dir={tmp_path}/r")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Error: every request failed (4 of 4" in done.stderr


# ------------------------------------------------------- case 6: start-up checks


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["scheduler.max_tokens=8"], "scheduler.max_tokens=8"),
        (["metadata.max_num_seqs=3"], "metadata.max_num_seqs=3"),
        (["num_threads=100000"], "num_threads=100000"),
        (["model.max_position=16"], "model.max_position=16"),
        (["+scheduler.block_size=8"], "scheduler.block_size=8: block_size is the run's"),
        (["+metadata.block_size=8"], "metadata.block_size=8: block_size is the run's"),
        (["+metadata.decode_batch.step2=4"], "BucketAxisConf has no key step2"),
        (["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b",
          "speculative.method=ngram", "speculative.tokens=1000"], "speculative.tokens=1000"),
        (["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b",
          "disagg.prefill=1000", "disagg.decode=1000"], "disagg.prefill=1000"),
    ],
)  # fmt: skip
def test_every_key_a_check_reads_is_checked_where_it_is_set(overrides, key):
    from pipeline.config.checks import ConfigError
    from pipeline.executors import build_engine

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build_engine(make_config([*SMALL, *overrides]))
    assert "\n" not in str(err.value)


def test_speculative_tokens_up_to_the_budget_run(tmp_path):
    """The bound is the budget: k + 1 = max_tokens slots still serve every request."""
    overrides = ["executor=simulated", "hardware=gaudi3", "model=spec/llama31_8b",
                 "max_tokens=64", "speculative.method=ngram", "speculative.tokens=63"]  # fmt: skip
    assert run_job(make_config([*SMALL, *overrides]), job(tmp_path / "run")) == 0
    metrics = metrics_of(tmp_path / "run")
    assert metrics["status"] == "ok" and metrics["num_errors"] == 0
