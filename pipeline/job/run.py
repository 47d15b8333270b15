"""Serves a composed config into its run folder, or completes an interrupted one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from omegaconf import DictConfig

from pipeline.config.checks import ConfigError, describe_model
from pipeline.config.engine_profile import engine_name
from pipeline.disagg.config import disaggregated
from pipeline.disagg.deployment import run_deployment
from pipeline.executors import build_engine
from pipeline.executors.build import check_resolves
from pipeline.job.console import Progress, summary_table
from pipeline.job.engine import Engine
from pipeline.job.metrics import StepTotals, summarise
from pipeline.job.serving import (
    Ending,
    Hooks,
    fail_if_none_served,
    report_failures,
    serve_and_summarise,
)
from pipeline.job.signals import RunInterrupted, as_interrupted, stop_on_signals
from pipeline.job.slo import Slo, slo_metrics
from pipeline.run_folder import artefacts
from pipeline.run_folder.artefacts import INTERRUPTED
from pipeline.run_folder.folder_lock import FolderLock
from pipeline.run_folder.identity import write_identity
from pipeline.run_folder.reader import RunStatus
from pipeline.run_folder.records import StepRecord
from pipeline.run_folder.resume import Previous, appendable, load_previous, pending_requests
from pipeline.schema import schema_view
from stages.scheduling.request import Request

log = structlog.get_logger(__name__)


def run(cfg: DictConfig, out_dir: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Serves the workload into `out_dir`; with `resume=RUN_DIR`, completes that folder
    instead, with its own config (`overrides` are the command line's, checked against it).
    A stop signal raises RunInterrupted once the folder is written."""
    # Paddle loads once the config has passed its checks (build_engine), so that a config
    # error or --help costs no import; loading it puts the stop handlers back.
    with stop_on_signals():
        check_resolves(cfg)
        if not cfg.get("resume"):
            with FolderLock(out_dir):
                artefacts.write_resolved_config(cfg, out_dir)
                write_identity(cfg, out_dir)
                slo = slo_of(cfg)  # a bad bound stops the run before anything is built
                if disaggregated(cfg):
                    return run_deployment(cfg, out_dir, slo)
                engine, requests = build_engine(cfg)
                return run_requests(cfg, engine, requests, out_dir)
        return _resume(Path(cfg.resume).expanduser(), overrides)


def _resume(folder: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """Completes `folder` while holding it: nothing else may write it meanwhile, and what
    it holds is read only once the lock is held."""
    if artefacts.read_run_config(folder) is None:  # not a run folder: the one-line reason
        load_previous(folder, overrides)
    problem = artefacts.run_folder_problem(folder)
    if problem:
        raise ConfigError(problem)
    with FolderLock(folder):
        previous = load_previous(folder, overrides)
        check_resolves(previous.cfg)
        slo_of(previous.cfg)
        engine, requests = build_engine(previous.cfg)
        return run_requests(previous.cfg, engine, requests, folder, previous)


def run_requests(
    cfg: DictConfig,
    engine: Engine,
    requests: list[Request],
    out_dir: Path,
    previous: Previous | None = None,
) -> dict[str, Any]:
    """Serves the requests the folder has no generation for, writing each as it finishes."""
    pending = pending_requests(requests, previous) if previous else list(requests)
    conf = schema_view(cfg)
    log.info(
        "pipeline_ready",
        requests=len(pending),
        resumed_from=len(requests) - len(pending) if previous else None,
        model_parameters=engine.model.num_parameters,
        num_blocks=engine.scheduler.kv_cache.num_blocks,
        max_tokens=conf.max_tokens,
        block_size=conf.block_size,
        prefix_caching=engine.scheduler.kv_cache.prefix is not None,
    )
    steps: list[StepRecord] = list(previous.steps) if previous else []
    files = RunFiles(engine, pending, out_dir, previous, steps)

    def summarise(duration: float, warmup_s: float, status: RunStatus) -> dict[str, Any]:
        duration += previous.duration_s if previous else 0.0
        metrics = run_metrics(cfg, engine, requests, steps, duration, warmup_s, status)
        if previous:
            metrics["resumed_requests"] = len(pending)
        return fail_if_none_served(metrics, requests, status)

    hooks = Hooks(files.open, files.on_unfinished, files.close, files.finish)
    served = serve_and_summarise(
        cfg, engine, files.run, lambda: unfinished(pending), summarise, out_dir,
        ended_by=stop_signal, hooks=hooks,
    )  # fmt: skip
    metrics = served.metrics
    report_run(metrics, requests, out_dir, stopped=served.stopped_by is not None)
    if served.stopped_by is not None:
        stopped = as_interrupted(served.stopped_by)
        stopped.recorded = True
        raise stopped
    return metrics


def report_run(
    metrics: dict[str, Any], requests: Sequence[Request], out_dir: Path, stopped: bool
) -> None:
    """The run's log line and summary; where requests failed (and no signal stopped the
    run), one more line: an error where every one failed, a warning where some did."""
    log.info(
        "run_finished",
        status=metrics["status"],
        duration_s=round(metrics["duration_s"], 3),
        output_throughput=round(metrics["output_throughput"], 1),
        errors=metrics["num_errors"],
        out_dir=str(out_dir),
    )
    print(f"{metrics['status']}: {out_dir}\n{summary_table(metrics)}")
    if not stopped:
        report_failures(metrics, requests)


def unfinished(requests: Sequence[Request]) -> list[Request]:
    return [r for r in requests if not r.finished]


def stop_signal(err: BaseException) -> Ending | None:
    """A stop signal ends a serving run: what is unfinished is failed `interrupted`."""
    if isinstance(err, RunInterrupted | KeyboardInterrupt):
        return Ending(RunStatus.INTERRUPTED, INTERRUPTED)
    return None


def run_metrics(
    cfg: DictConfig,
    engine: Engine,
    requests: Sequence[Request],
    steps: Sequence[StepRecord] | StepTotals,
    duration: float,
    warmup_s: float,
    status: RunStatus,
) -> dict[str, Any]:
    """metrics.json: the serving metrics, the SLO's, and what the device predicts."""
    metrics = {
        "status": status,
        "engine": engine_name(cfg),  # whose step rules and shapes the run predicts
        **summarise(requests, steps, duration),
        **slo_metrics(requests, duration, slo_of(cfg)),
        "bucket_misses": engine.metadata.bucket_misses,
        "warmup_s": warmup_s,
        "num_blocks": engine.scheduler.kv_cache.num_blocks,
        "max_model_len": schema_view(cfg).max_model_len,
        "warmup_shapes": sum(engine.warmup_counts().values()),  # graphs, as warmup_plan logs
        **device_metrics(engine),
    }
    if engine.workload_counts:
        metrics["workload_counts"] = engine.workload_counts
        context = model_context(cfg)
        if context:  # what the cut prompts could be served whole up to
            metrics["max_position_embeddings"] = context
    return metrics


def model_context(cfg: DictConfig) -> int:
    """The context the model was trained for, where its description states one (0: not)."""
    try:
        return describe_model(cfg)[0].max_position_embeddings
    except ConfigError:
        return 0


def slo_of(cfg: DictConfig) -> Slo:
    """The run's SLO (`slo.*`); a folder written before SLOs existed has none set."""
    try:
        return Slo.of(cfg.get("slo"))
    except ValueError as err:
        raise ConfigError(str(err)) from err


class RunFiles:
    """A batch run's files as it serves, opened once it is warm: each step and each ended
    request appended to the folder as it happens, with the progress bar."""

    def __init__(
        self,
        engine: Engine,
        pending: list[Request],
        out_dir: Path,
        previous: Previous | None,
        steps: list[StepRecord],
    ) -> None:
        self.engine = engine
        self.pending = pending
        self.out_dir = out_dir
        self.previous = previous
        self.steps = steps
        self.first_step = len(steps)
        self.opened: tuple[artefacts.StepWriter, artefacts.GenerationWriter, Progress] | None
        self.opened = None

    def open(self, warmup_s: float) -> None:
        previous = self.previous
        if previous is not None:  # the resumed run's steps follow the folder's
            appendable(self.out_dir / artefacts.STEPS)
        step_writer = artefacts.StepWriter(self.out_dir, append=previous is not None)
        generations = artefacts.GenerationWriter(
            self.out_dir, self.engine.tokenizer, previous.kept.values() if previous else ()
        )
        self.opened = (step_writer, generations, Progress(len(self.pending)))

    def run(self) -> float:
        """Runs the engine; returns the run's time."""
        return self.engine.run(self.pending, on_step=self.on_step, on_finish=self.on_finish)

    def on_step(self, record: StepRecord) -> None:
        assert self.opened is not None
        step_writer, _, progress = self.opened
        record.step += self.first_step  # a resumed folder's steps go on from the earlier ones
        self.steps.append(record)
        step_writer(record)
        progress.on_step(record)

    def on_finish(self, request: Request) -> None:
        assert self.opened is not None
        _, generations, progress = self.opened
        generations(request)
        progress.on_finish()

    def on_unfinished(self, request: Request) -> None:
        assert self.opened is not None
        self.opened[1](request)

    def close(self) -> None:
        if self.opened is not None:
            step_writer, _, progress = self.opened
            progress.close()
            step_writer.close()

    def finish(self) -> None:
        """generations.jsonl in workload order, once the run has ended."""
        if self.opened is not None:
            self.opened[1].finish()


def device_metrics(engine: Engine) -> dict[str, Any]:
    """What a simulated run predicts beyond the serving metrics: the device, the graphs
    warmup would compile and how long that takes, and the compiles during serving."""
    if engine.simulation is None:  # a device that computes its steps predicts nothing
        return {"simulated": False}
    # Graphs, as warmup_plan logs them.
    return engine.simulation.metrics(sum(engine.warmup_counts().values()))
