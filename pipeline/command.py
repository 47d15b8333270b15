"""Every `python -m pipeline...` command's one way in: a declared Command and its `main`.

A command is either a Hydra job (`HydraCommand`: a config name, and the function one job
runs; Hydra parses the command line, runs sweeps, prints --help and calls the config's
callbacks) or an argparse command (`ArgparseCommand`: a parser builder and the function
its arguments run). Both end the same way: the errors a command declares (`Failure`) are
one line on stderr, `Error: ...`, and the exit code they declare; a stop signal exits
128 + its number. A Hydra job may also note why it ended in its folder's metrics.json,
and may let a sweep go on past a failed job. `OptionChoice` picks one of two commands by
an option of the command line (`python -m pipeline.calibrate --published FILE`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import hydra
import structlog
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pipeline import logs  # noqa: F401  (logs configures structlog)
from pipeline.config.checks import ConfigError
from pipeline.job.signals import RunInterrupted
from pipeline.run_folder import artefacts
from pipeline.run_folder.folder_lock import FolderBusy
from pipeline.run_folder.reader import RunStatus
from pipeline.schema import register_schemas


def as_given(err: Exception, args: Any) -> str:
    """The error's own message, the default one-line error."""
    return str(err)


@dataclass(frozen=True)
class Failure:
    """Errors of these types end the command with `Error: describe(err, args)` on stderr
    and `code`; `args` are the command's parsed arguments (a Hydra job's config)."""

    types: tuple[type[Exception], ...]
    code: int
    describe: Callable[[Exception, Any], str] = as_given


# A run's failures: a config to change exits 2, a run folder that cannot be written 1.
RUN_FAILURES = (Failure((ConfigError,), 2), Failure((artefacts.RunFolderError,), 1))


def failure_of(failures: Sequence[Failure], err: BaseException) -> Failure | None:
    """The first declared failure `err` is, if any."""
    return next((f for f in failures if isinstance(err, f.types)), None)


def error_line(failures: Sequence[Failure], err: BaseException, args: Any = None) -> str:
    """What a failure says: a declared one its own words, any other its type as well."""
    failure = failure_of(failures, err)
    if failure is None or not isinstance(err, Exception):
        return f"{type(err).__name__}: {err}"
    return failure.describe(err, args)


def record_failure(status: RunStatus, message: str, out_dir: Path) -> None:
    """metrics.json says why the job ended, unless the folder cannot be written either."""
    try:
        artefacts.write_metrics({"status": status, "error": message}, out_dir)
    except artefacts.RunFolderError:
        pass


@dataclass(frozen=True)
class ArgparseCommand:
    """A command whose arguments argparse reads: `run` gets them parsed and as given (the
    command line a written file may quote) and returns the exit code."""

    name: str
    parser: Callable[[], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace, list[str]], int]
    failures: tuple[Failure, ...] = ()

    def main(self, argv: Sequence[str] | None = None) -> int:
        given = list(sys.argv[1:] if argv is None else argv)
        args = self.parser().parse_args(given)
        try:
            return self.run(args, given)
        except Exception as err:
            failure = failure_of(self.failures, err)
            if failure is None:
                raise
            print(f"Error: {failure.describe(err, args)}", file=sys.stderr)
            return failure.code


class SweepOnFailure(Enum):
    """What a failed job does to the sweep it is part of."""

    STOPS = "stops"  # the job's error ends the command
    GOES_ON = "goes on"  # in a sweep the error is logged and the next job runs
    ALWAYS_GOES_ON = "always goes on"  # also a single job's: the report shows the error


@dataclass(frozen=True)
class Job:
    """What a Hydra job knows of itself."""

    out_dir: Path
    multirun: bool
    num: int
    choices: dict[str, Any]
    overrides: list[str]


def current_job() -> Job:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    # As typed: an override's own `${...}` is text here, not resolved (which could take
    # for ever on references that double).
    typed = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)
    return Job(
        out_dir=Path(hydra_cfg.runtime.output_dir),
        multirun=multirun,
        num=hydra_cfg.job.num if multirun else 0,
        choices=dict(hydra_cfg.runtime.choices),
        overrides=[str(o) for o in typed] if isinstance(typed, list) else [],
    )


@dataclass(frozen=True)
class HydraCommand:
    """A command Hydra runs: `run` serves one job of the config `config_name` and returns
    the exit code (0: the sweep goes on). records_failures: a job that fails or is stopped
    before its folder says so gets a metrics.json with its status and error."""

    name: str
    config_name: str
    run: Callable[[DictConfig, Job], int]
    failures: tuple[Failure, ...] = RUN_FAILURES
    records_failures: bool = False
    sweep: SweepOnFailure = SweepOnFailure.STOPS

    def main(self) -> None:
        register_schemas()
        conf = "pkg://pipeline.conf"
        task = hydra.main(version_base="1.3", config_path=conf, config_name=self.config_name)(
            self.job
        )
        try:
            task()
        except RunInterrupted as stop:  # a sweep's own process: its launcher stopped the jobs
            structlog.get_logger(self.name).warning("sweep_interrupted", signal=str(stop))
            sys.exit(stop.exit_code)

    def job(self, cfg: DictConfig) -> None:
        """One job: its exit code, or the one-line error of a failure."""
        job = current_job()
        structlog.contextvars.clear_contextvars()  # a joblib worker runs several jobs
        structlog.contextvars.bind_contextvars(job=job.num)
        try:
            code = self.run(cfg, job)
        except RunInterrupted as stop:
            if self.records_failures and not stop.recorded:  # stopped before serving began
                record_failure(RunStatus.INTERRUPTED, str(stop), job.out_dir)
            # Exiting (not returning) ends a sweep too: the jobs after this one do not start.
            structlog.get_logger(self.name).warning(
                "run_interrupted", signal=str(stop), out_dir=str(job.out_dir)
            )
            sys.exit(stop.exit_code)
        except Exception as err:
            code = self.failed(err, cfg, job)
        if code:
            sys.exit(code)

    def failed(self, err: Exception, cfg: DictConfig, job: Job) -> int:
        message = error_line(self.failures, err, cfg)
        if self.records_failures and not isinstance(err, FolderBusy):  # not this job's folder
            record_failure(RunStatus.FAILED, message, job.out_dir)
        goes_on = self.sweep is SweepOnFailure.ALWAYS_GOES_ON or (
            self.sweep is SweepOnFailure.GOES_ON and job.multirun
        )
        failure = failure_of(self.failures, err)
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or (failure is None and not goes_on):
            raise err
        if goes_on:  # one failed job must not stop the sweep
            structlog.get_logger(self.name).error("job_failed", error=message)
            return 0
        assert failure is not None
        print(f"Error: {message}", file=sys.stderr)
        return failure.code


@dataclass(frozen=True)
class OptionChoice:
    """One command line, two commands: with `option` given, the argparse command `given`
    reads the whole command line; without it, the Hydra command `otherwise` runs."""

    name: str
    option: str
    given: ArgparseCommand
    otherwise: HydraCommand

    def main(self, argv: Sequence[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        mode = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        mode.add_argument(self.option, nargs="?", const="")
        chosen, _ = mode.parse_known_args(argv)
        if getattr(chosen, self.option.lstrip("-").replace("-", "_")) is not None:
            return self.given.main(argv)
        self.otherwise.main()
        return 0


Command = ArgparseCommand | HydraCommand | OptionChoice
