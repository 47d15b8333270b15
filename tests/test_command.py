"""One command runner (pipeline/command.py) and one serve-and-summarise path
(pipeline/job/serving.py): every command goes through the first, every way of serving through
the second."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.command import (
    RUN_FAILURES,
    ArgparseCommand,
    Command,
    Failure,
    HydraCommand,
    Job,
    OptionChoice,
    SweepOnFailure,
)
from pipeline.config.checks import ConfigError
from pipeline.job.serving import Ending, Hooks, serve_and_summarise
from pipeline.run_folder.artefacts import RunFolderError
from pipeline.run_folder.reader import RunStatus
from stages.scheduling.request import FinishReason, Request
from tests.helpers import REPO, run_cli

COMMANDS = [
    "pipeline",
    "pipeline.buckets",
    "pipeline.calibrate",
    "pipeline.deploy",
    "pipeline.inspect",
    "pipeline.plan",
    "pipeline.review",
    "pipeline.serve",
    "pipeline.summary",
]


def test_the_list_holds_every_command():
    mains = {f"pipeline.{p.parent.name}" for p in (REPO / "pipeline").glob("*/__main__.py")}
    assert set(COMMANDS) == {"pipeline", *mains}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_is_a_declared_command_its_main_runs(name):
    """The module `python -m NAME` runs does one thing: COMMAND.main(), where COMMAND is the
    runner's; `pipeline` and `pipeline.serve` declare it in __main__ (guarded), the others
    in the package."""
    main_file = REPO / Path(*name.split(".")) / "__main__.py"
    declared_in = f"{name}.__main__" if "COMMAND = " in main_file.read_text() else name
    command = importlib.import_module(declared_in).COMMAND
    assert isinstance(command, Command)
    assert command.name == name
    calls = [
        ast.unparse(node.func)
        for node in ast.walk(ast.parse(main_file.read_text()))
        if isinstance(node, ast.Call)
    ]
    assert "COMMAND.main" in calls


def test_no_command_parses_or_reports_on_its_own():
    """hydra.main, a parser's parse_args and sys.argv are the runner's only."""
    for path in (REPO / "pipeline").rglob("*.py"):
        if path.name == "command.py":
            continue
        text = path.read_text()
        assert "@hydra.main" not in text and "hydra.main(" not in text, path
        assert ".parse_args(" not in text and "sys.argv[1:]" not in text, path


def bad_command(err: Exception) -> ArgparseCommand:
    def run(args: argparse.Namespace, argv: list[str]) -> int:
        raise err

    return ArgparseCommand(
        name="test",
        parser=lambda: argparse.ArgumentParser(prog="test"),
        run=run,
        failures=(
            Failure((KeyError,), 3),
            Failure((ValueError,), 2, lambda e, args: f"{type(args).__name__}: said {e}"),
        ),
    )


def test_an_argparse_commands_declared_failure_is_one_line_and_its_code(capsys):
    assert bad_command(ValueError("no")).main([]) == 2
    assert capsys.readouterr().err == "Error: Namespace: said no\n"
    assert bad_command(KeyError("k")).main([]) == 3
    assert capsys.readouterr().err == "Error: 'k'\n"
    with pytest.raises(RuntimeError):  # undeclared: the traceback, as for a bug
        bad_command(RuntimeError("bug")).main([])
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error
        bad_command(ValueError()).main(["--nope"])
    assert usage.value.code == 2


def job(tmp_path: Path, multirun: bool = False) -> Job:
    return Job(out_dir=tmp_path, multirun=multirun, num=0, choices={}, overrides=[])


def hydra_command(records: bool, sweep: SweepOnFailure) -> HydraCommand:
    return HydraCommand("t", "config", lambda cfg, job: 0, RUN_FAILURES, records, sweep)


def test_a_hydra_jobs_failure_is_noted_and_ends_or_lets_the_sweep_go_on(tmp_path, capsys):
    cfg = OmegaConf.create({})
    run = hydra_command(True, SweepOnFailure.GOES_ON)
    assert run.failed(ConfigError("give x"), cfg, job(tmp_path)) == 2
    assert capsys.readouterr().err == "Error: give x\n"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics == {"status": "failed", "error": "give x"}
    assert run.failed(RunFolderError("cannot write"), cfg, job(tmp_path)) == 1
    assert run.failed(ConfigError("give x"), cfg, job(tmp_path, multirun=True)) == 0
    assert capsys.readouterr().err == "Error: cannot write\n"  # the sweep's job: logged only
    (tmp_path / "b").mkdir()
    with pytest.raises(RuntimeError):
        run.failed(RuntimeError("bug"), cfg, job(tmp_path / "b"))
    assert "RuntimeError: bug" in (tmp_path / "b" / "metrics.json").read_text()
    plan = hydra_command(True, SweepOnFailure.ALWAYS_GOES_ON)
    assert plan.failed(RuntimeError("bug"), cfg, job(tmp_path / "c")) == 0
    quiet = hydra_command(False, SweepOnFailure.STOPS)
    assert quiet.failed(ConfigError("give y"), cfg, job(tmp_path / "d")) == 2
    assert not (tmp_path / "d").exists()


def test_an_option_picks_one_of_two_commands(monkeypatch):
    ran = []
    monkeypatch.setattr(HydraCommand, "main", lambda self: ran.append("hydra"))
    given = ArgparseCommand(
        "fit",
        lambda: _parser_with_published(),
        lambda args, argv: ran.append(args.published) or 5,
    )
    choice = OptionChoice("c", "--published", given, hydra_command(False, SweepOnFailure.STOPS))
    assert choice.main(["hardware=h100", "--published", "rows.csv"]) == 5
    assert choice.main(["--published=rows.csv"]) == 5
    assert choice.main(["hardware=h100", "--help"]) == 0  # Hydra's own --help
    assert choice.main(["--pub", "rows.csv"]) == 0  # no abbreviation picks it
    assert ran == ["rows.csv", "rows.csv", "hydra", "hydra"]


def _parser_with_published() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--published", required=True)
    parser.add_argument("rest", nargs="*")
    return parser


@pytest.mark.slow
def test_calibrate_published_picks_the_fit_from_the_real_command_line(tmp_path):
    done = run_cli(tmp_path, "pipeline.calibrate", "--published", "missing.csv", "hardware=h100")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert len(done.stderr.strip().splitlines()) == 1


# -- the serve-and-summarise path -------------------------------------------------------------
def warmup_calls(source: str) -> list[str]:
    """The functions that call `.warmup()`, by name (a call at module level: "")."""
    callers = []

    def visit(node: ast.AST, inside: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef) else inside
            call = isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
            if call and child.func.attr == "warmup":  # type: ignore[union-attr]
                callers.append(inside)
            visit(child, name)

    visit(ast.parse(source), "")
    return callers


def test_the_ways_of_serving_share_the_path():
    """Each caller goes through serve_and_summarise, and warmup is called there alone (or
    by a deployment's own warmup, which warms its instances side by side)."""
    callers = ["job/run.py", "plan/capacity.py", "serve/worker.py", "disagg/deployment.py"]
    for path in callers:
        assert "serve_and_summarise(" in (REPO / "pipeline" / path).read_text(), path
    for path in (REPO / "pipeline").rglob("*.py"):
        if path.name != "serving.py":
            assert set(warmup_calls(path.read_text())) <= {"warmup"}, path


class FakeEngine:
    """warmup, and a clock that reads 7 s: what the path asks of an engine."""

    def __init__(self) -> None:
        self.warmed = 0

    def warmup(self) -> float:
        self.warmed += 1
        return 1.5

    def now(self) -> float:
        return 7.0


def requests(n: int) -> list[Request]:
    return [
        Request(id=f"r{i}", index=i, prompt="", prompt_ids=range(3), max_new_tokens=4)
        for i in range(n)
    ]


def summary(duration: float, warmup_s: float, status: RunStatus) -> dict:
    return {"status": status, "duration_s": duration, "warmup_s": warmup_s}


def test_a_run_that_returns_is_ok_and_written(tmp_path):
    engine, order = FakeEngine(), []
    served = serve_and_summarise(
        OmegaConf.create({"warmup": True}), engine, lambda: order.append("serve") or 3.0,
        lambda: [], summary, tmp_path,
        hooks=Hooks(ready=lambda w: order.append(f"ready {w}"), close=lambda: order.append("close"),
                    finish=lambda: order.append("finish")),
    )  # fmt: skip
    assert order == ["ready 1.5", "serve", "close", "finish"]
    assert served.metrics == {"status": RunStatus.OK, "duration_s": 3.0, "warmup_s": 1.5}
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "ok"
    assert served.stopped_by is None


def test_a_run_ended_by_its_error_fails_the_open_requests_at_the_clock(tmp_path):
    open_ones, told = requests(2), []

    def serve() -> float:
        raise KeyboardInterrupt

    served = serve_and_summarise(
        OmegaConf.create({"warmup": False}), FakeEngine(), serve, lambda: open_ones, summary,
        tmp_path, ended_by=lambda err: Ending(RunStatus.INTERRUPTED, "stopped"),
        hooks=Hooks(on_unfinished=told.append),
    )  # fmt: skip
    assert isinstance(served.stopped_by, KeyboardInterrupt)
    assert served.metrics == {"status": RunStatus.INTERRUPTED, "duration_s": 7.0, "warmup_s": 0}
    assert told == open_ones
    assert all(r.finish_reason == FinishReason.ERROR and r.error == "stopped" for r in told)
    assert all(r.finish_s == 7.0 for r in told)


def test_an_early_verdict_stops_the_run_and_fails_what_is_left(tmp_path):
    left = requests(1)
    served = serve_and_summarise(
        OmegaConf.create({"warmup": True}), FakeEngine(), lambda: 2.0, lambda: left, summary,
        tmp_path, ended_early=lambda: Ending(RunStatus.STOPPED, "decided"),
    )  # fmt: skip
    assert served.metrics["status"] == RunStatus.STOPPED and left[0].error == "decided"


def test_an_error_not_the_runs_propagates_with_the_files_closed_and_no_metrics(tmp_path):
    closed, finished = [], []

    def serve() -> float:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        serve_and_summarise(
            OmegaConf.create({"warmup": True}), FakeEngine(), serve, lambda: [], summary,
            tmp_path,
            hooks=Hooks(close=lambda: closed.append(1), finish=lambda: finished.append(2)),
        )  # fmt: skip
    assert closed == [1] and finished == [] and not (tmp_path / "metrics.json").exists()


def test_an_error_in_warmup_ends_the_run_only_where_the_ending_says_so(tmp_path):
    class BrokenWarmup(FakeEngine):
        def warmup(self) -> float:
            raise KeyboardInterrupt

    cfg = OmegaConf.create({"warmup": True})
    stop = Ending(RunStatus.INTERRUPTED, "stopped")
    with pytest.raises(KeyboardInterrupt):  # a batch run: it had not begun
        serve_and_summarise(
            cfg, BrokenWarmup(), lambda: 1.0, lambda: [], summary, tmp_path / "a",
            ended_by=lambda err: stop,
        )  # fmt: skip
    failed = Ending(RunStatus.FAILED, "the engine failed", in_warmup=True)
    served = serve_and_summarise(
        cfg, BrokenWarmup(), lambda: 1.0, lambda: [], summary, tmp_path,
        ended_by=lambda err: failed,
    )  # fmt: skip
    assert served.metrics["status"] == RunStatus.FAILED and served.metrics["warmup_s"] == 0.0
