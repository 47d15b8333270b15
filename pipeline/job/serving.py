"""The one sequence that serves requests and summarises them, whoever serves them: a batch
run (pipeline/job/run.py), a capacity probe (pipeline/plan/capacity.py) and the server's engine
thread (pipeline/serve/worker.py).

warmup -> serve the requests -> fail the unfinished -> close the files -> metrics.json.

What differs between them is given, not looked up: how the requests are served (a batch's
engine.run, a probe's with its SLO verdict as the stop, the server's engine.serve on its
paced clock), which errors end the run early and how (`ended_by`: a batch run's stop
signal, the server's any error), whether a run that returned was ended early (`ended_early`:
a probe whose verdict was decided), and what the metrics are made from (`summarise`: the
requests in memory, or the server's folder).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig

from pipeline.run_folder import artefacts
from pipeline.run_folder.reader import RunStatus
from stages.scheduling.request import Request


class Servable(Protocol):
    """What the sequence serves: an engine, or a deployment of several (they warm up side
    by side)."""

    def warmup(self) -> float:
        """Compiles every bucket shape; its seconds."""

    def now(self) -> float:
        """The run's clock: the wall's, or a simulated device's."""


@dataclass(frozen=True)
class Ending:
    """How a run ends before its requests have: its status, what each request still open
    is told, and whether an error in warmup ends it so too (else that error propagates: the
    run had not begun)."""

    status: RunStatus
    reason: str
    in_warmup: bool = False


@dataclass(frozen=True)
class Served:
    """The run's metrics (as written) and the error that ended it early, if one did."""

    metrics: dict[str, Any]
    stopped_by: BaseException | None


def never(err: BaseException) -> Ending | None:
    """No error is the run's to end it: each propagates."""
    return None


def not_early() -> Ending | None:
    return None


def nothing(*args: object) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    """What a caller does around the shared steps: `ready` once warm (with warmup's
    seconds), `on_unfinished` for each request failed at the end (its generations line, its
    client's answer), `close` its files however the run ended (before the metrics, which
    may read them), `finish` its files once the run has ended rather than broken."""

    ready: Callable[[float], None] = nothing
    on_unfinished: Callable[[Request], None] = nothing
    close: Callable[[], None] = nothing
    finish: Callable[[], None] = nothing


def serve_and_summarise(
    cfg: DictConfig,
    engine: Servable,
    serve: Callable[[], float],
    open_requests: Callable[[], Iterable[Request]],
    summarise: Callable[[float, float, RunStatus], dict[str, Any]],
    out_dir: Path,
    ended_by: Callable[[BaseException], Ending | None] = never,
    ended_early: Callable[[], Ending | None] = not_early,
    hooks: Hooks | None = None,
) -> Served:
    """Warms the engine up (warmup=true), serves (`serve` returns the run's seconds), fails
    the requests still open (`open_requests`) if the run ended early, and writes
    metrics.json into `out_dir`: `summarise(duration, warmup_s, status)`."""
    hooks = hooks or Hooks()
    warmup_s, duration, stopped_by = 0.0, 0.0, None
    ending: Ending | None = None
    warm = False
    try:
        try:
            warmup_s = warm_up(cfg, engine)
            hooks.ready(warmup_s)
            warm = True
            duration = serve()
            ending = ended_early()
        except BaseException as err:
            ending = ended_by(err)
            if ending is None or not (warm or ending.in_warmup):
                raise
            stopped_by, duration = err, engine.now()
        if ending is not None:
            for request in list(open_requests()):
                request.fail(ending.reason, duration)
                hooks.on_unfinished(request)
    finally:
        hooks.close()
    hooks.finish()
    status = ending.status if ending else RunStatus.OK
    metrics = summarise(duration, warmup_s, status)
    artefacts.write_metrics(metrics, out_dir)
    return Served(metrics, stopped_by)


def failed_requests(requests: Sequence[Request]) -> str:
    """The requests that failed, in one line: how many, and the first one's error."""
    failed = [r for r in requests if r.error]
    every = "every request" if len(failed) == len(requests) else "some requests"
    return (
        f"{every} failed ({len(failed)} of {len(requests)}; the first, {failed[0].id!r}: "
        f"{' '.join(str(failed[0].error).split())[:300]}): see generations.jsonl"
    )


def fail_if_none_served(
    metrics: dict[str, Any], requests: Sequence[Request], status: RunStatus
) -> dict[str, Any]:
    """A run that ended OK with every request failed is a failed run (its command exits
    1): `metrics` with that status and the one line that says so."""
    if status is RunStatus.OK and requests and all(r.error for r in requests):
        metrics["status"], metrics["error"] = RunStatus.FAILED, failed_requests(requests)
    return metrics


def report_failures(metrics: dict[str, Any], requests: Sequence[Request]) -> None:
    """Where requests failed, one line on stderr: an error where every one failed (the
    run failed), a warning where some did."""
    if any(r.error for r in requests):
        said = "Error" if metrics["status"] == RunStatus.FAILED else "Warning"
        print(f"{said}: {failed_requests(requests)}", file=sys.stderr)


def warm_up(cfg: DictConfig, engine: Servable) -> float:
    """warmup=true: every bucket shape the engine's steps can pad to, compiled before the
    first request (a batch run and a server alike); its seconds."""
    return engine.warmup() if cfg.warmup else 0.0
