"""The real command line stopped by SIGTERM, SIGINT or SIGKILL mid-run: what was finished is
on disk, the exit code says which signal, and `+resume=RUN_DIR` completes the folder with
the tokens an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.run_folder.artefacts import INTERRUPTED, read_generations
from tests.helpers import ONE_THREAD

# Enough steps (one or two decodes at a time) that a signal lands mid-run.
WORK = [
    ONE_THREAD,
    "block_size=16",
    "max_num_seqs=2",
    "max_tokens=64",
    "max_model_len=256",
    "workload.num_requests=10",
    "workload.min_prompt_tokens=3",
    "workload.max_prompt_tokens=40",
    "workload.min_new_tokens=30",
    "workload.max_new_tokens=40",
]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}


def start(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def cli(cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first: {proc.stderr.read()}")
        if path.is_file() and len(read_generations(path)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} lines")


def stop_mid_run(tmp_path: Path, name: str, signum: int) -> tuple[Path, int]:
    """A run stopped once two requests are finished; returns its folder and exit code."""
    run_dir = tmp_path / name
    proc = start(tmp_path, f"hydra.run.dir={run_dir}", *WORK)
    wait_for_lines(run_dir / "generations.jsonl", 2, proc)
    proc.send_signal(signum)
    return run_dir, proc.wait(timeout=120)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("whole")
    result = cli(root, "pipeline", f"hydra.run.dir={root / 'run'}", *WORK)
    assert result.returncode == 0, result.stderr
    return root / "run"


def finished(run_dir: Path) -> list[dict]:
    return [g for g in read_generations(run_dir / "generations.jsonl") if g["error"] is None]


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"]
)
@pytest.mark.slow
def test_a_signal_leaves_an_interrupted_folder_that_resume_completes(
    tmp_path, uninterrupted, signum, code
):
    run_dir, exit_code = stop_mid_run(tmp_path, "run", signum)
    assert exit_code == code
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "interrupted" and metrics["output_throughput"] > 0
    lines = read_generations(run_dir / "generations.jsonl")
    assert [g["index"] for g in lines] == list(range(10))  # every request, workload order
    done = finished(run_dir)
    assert 2 <= len(done) < 10 and any(g["error"] == INTERRUPTED for g in lines)

    result = cli(tmp_path, "pipeline", f"+resume={run_dir}", f"hydra.run.dir={tmp_path / 'r'}")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["num_requests"] == 10
    assert metrics["num_errors"] == 0 and metrics["resumed_requests"] == 10 - len(done)
    lines = read_generations(run_dir / "generations.jsonl")
    assert [g["index"] for g in lines] == list(range(10))
    assert all(g in lines for g in done)  # the finished lines are kept as they were
    review = cli(tmp_path, "pipeline.review", uninterrupted, run_dir, "--fail-on-output-diff")
    assert review.returncode == 0 and "identical tokens for 10/10 requests" in review.stdout


@pytest.mark.slow
def test_sigkill_keeps_the_written_lines_and_resume_completes(tmp_path, uninterrupted):
    run_dir, exit_code = stop_mid_run(tmp_path, "run", signal.SIGKILL)
    assert exit_code == -signal.SIGKILL
    assert not (run_dir / "metrics.json").exists()
    done = finished(run_dir)
    assert len(done) >= 2 and all(g["finish_reason"] == "length" for g in done)
    summary = cli(tmp_path, "pipeline.review", uninterrupted, run_dir)
    assert summary.returncode == 0, summary.stderr
    assert "status" in summary.stdout and "interrupted" in summary.stdout

    result = cli(tmp_path, "pipeline", f"+resume={run_dir}", "num_threads=2")  # speed only
    assert result.returncode == 0, result.stderr
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").open()]
    assert [s["step"] for s in steps] == list(range(len(steps)))  # numbered on across runs
    review = cli(tmp_path, "pipeline.review", uninterrupted, run_dir, "--fail-on-output-diff")
    assert review.returncode == 0, review.stdout + review.stderr


@pytest.mark.slow
def test_resume_refuses_overrides_that_change_tokens(tmp_path, uninterrupted):
    before = (uninterrupted / "generations.jsonl").read_text()
    for override, key in [("max_tokens=32", "max_tokens"), ("sampler=random", "sampler")]:
        result = cli(tmp_path, "pipeline", f"+resume={uninterrupted}", override)
        assert result.returncode == 2
        assert f"resume: {override} changes {key}" in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert (uninterrupted / "generations.jsonl").read_text() == before  # untouched
    nowhere = cli(tmp_path, "pipeline", f"+resume={tmp_path / 'nowhere'}")
    assert nowhere.returncode == 2 and "no such folder" in nowhere.stderr


def test_ctrl_c_in_a_sweep_stops_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    proc = start(tmp_path, "-m", f"hydra.sweep.dir={sweep}", "seed=0,1,2", *WORK)
    wait_for_lines(sweep / "0" / "generations.jsonl", 1, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    assert json.loads((sweep / "0" / "metrics.json").read_text())["status"] == "interrupted"
    assert not (sweep / "1").exists() and not (sweep / "2").exists()


@pytest.mark.slow
def test_a_bad_run_folder_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    result = cli(tmp_path, "pipeline", f"hydra.run.dir={tmp_path / 'file' / 'run'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().startswith("Error: the run folder") and "is a file" in result.stderr
    )
    (tmp_path / "run" / "generations.jsonl").mkdir(parents=True)
    result = cli(tmp_path, "pipeline", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "generations.jsonl is not a regular file" in result.stderr


def test_a_former_releases_targets_are_renamed_to_what_exists_now():
    from hydra.utils import get_object
    from omegaconf import OmegaConf

    from pipeline.run_folder.former_names import FORMER_TARGETS, rename_targets
    from tests.helpers import make_config

    for present in FORMER_TARGETS.values():
        assert get_object(present), present  # each points at something that exists
    cfg = make_config(["scheduler=whole", "sampler=random"])
    written = OmegaConf.to_yaml(cfg)  # as a run folder holds it, interpolations unresolved
    former = written
    for old, new in FORMER_TARGETS.items():
        former = former.replace(f"_target_: {new}\n", f"_target_: {old}\n")
    assert former != written
    read = OmegaConf.create(former)
    rename_targets(read)
    assert OmegaConf.to_yaml(read) == written
