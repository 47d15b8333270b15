"""Serves a composed config into its run folder, or completes an interrupted one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from omegaconf import DictConfig

from pipeline import artefacts
from pipeline.artefacts import INTERRUPTED
from pipeline.build import check_resolves
from pipeline.checks import ConfigError, describe_model
from pipeline.console import Progress, summary_table
from pipeline.engine import Engine
from pipeline.executors import build_engine
from pipeline.folder_lock import FolderLock
from pipeline.identity import write_identity
from pipeline.metrics import StepRecord, StepTotals, summarise
from pipeline.resume import Previous, load_previous, pending_requests
from pipeline.run_folder import RunStatus
from pipeline.signals import RunInterrupted, as_interrupted, stop_on_signals
from pipeline.slo import Slo, slo_metrics
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
                slo_of(cfg)  # a bad bound stops the run before anything is built
                engine, requests = build_engine(cfg)
                return serve(cfg, engine, requests, out_dir)
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
        return serve(previous.cfg, engine, requests, folder, previous)


def serve(
    cfg: DictConfig,
    engine: Engine,
    requests: list[Request],
    out_dir: Path,
    previous: Previous | None = None,
) -> dict[str, Any]:
    """Serves the requests the folder has no generation for, writing each as it finishes."""
    pending = pending_requests(requests, previous) if previous else list(requests)
    log.info(
        "pipeline_ready",
        requests=len(pending),
        resumed_from=len(requests) - len(pending) if previous else None,
        model_parameters=engine.model.num_parameters,
        num_blocks=engine.scheduler.kv_cache.num_blocks,
        max_tokens=cfg.max_tokens,
        block_size=cfg.block_size,
        prefix_caching=engine.scheduler.kv_cache.prefix is not None,
    )
    steps: list[StepRecord] = list(previous.steps) if previous else []
    warmup_s = warm_up(cfg, engine)
    duration, stopped = serve_pending(engine, pending, out_dir, previous, steps)
    status = RunStatus.INTERRUPTED if stopped else RunStatus.OK
    duration += previous.duration_s if previous else 0.0
    metrics = run_metrics(cfg, engine, requests, steps, duration, warmup_s, status)
    if previous:
        metrics["resumed_requests"] = len(pending)
    artefacts.write_metrics(metrics, out_dir)
    log.info(
        "run_finished",
        status=status,
        duration_s=round(metrics["duration_s"], 3),
        output_throughput=round(metrics["output_throughput"], 1),
        errors=metrics["num_errors"],
        out_dir=str(out_dir),
    )
    print(f"{status}: {out_dir}\n{summary_table(metrics)}")
    if stopped:
        stopped.recorded = True
        raise stopped
    return metrics


def warm_up(cfg: DictConfig, engine: Engine) -> float:
    """warmup=true: every bucket shape the engine's steps can pad to, compiled before the
    first request (a batch run and a server alike); its seconds."""
    return engine.warmup() if cfg.warmup else 0.0


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
        **summarise(requests, steps, duration),
        **slo_metrics(requests, duration, slo_of(cfg)),
        "bucket_misses": engine.metadata.bucket_misses,
        "warmup_s": warmup_s,
        "num_blocks": engine.scheduler.kv_cache.num_blocks,
        "max_model_len": cfg.max_model_len,
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


def serve_pending(
    engine: Engine,
    pending: list[Request],
    out_dir: Path,
    previous: Previous | None,
    steps: list[StepRecord],
) -> tuple[float, RunInterrupted | None]:
    """Runs the engine, appending each step and each finished request to the folder as it
    happens; returns the run's time and the signal that stopped it, if one did."""
    first_step = len(steps)
    step_writer = artefacts.StepWriter(out_dir, append=previous is not None)
    generations = artefacts.GenerationWriter(
        out_dir, engine.tokenizer, previous.kept.values() if previous else ()
    )
    progress = Progress(len(pending))

    def on_step(record: StepRecord) -> None:
        record.step += first_step  # a resumed folder's steps go on from the earlier ones
        steps.append(record)
        step_writer(record)
        progress.on_step(record)

    def on_finish(request: Request) -> None:
        generations(request)
        progress.on_finish()

    stopped: RunInterrupted | None = None
    try:
        duration = engine.run(pending, on_step=on_step, on_finish=on_finish)
    except (RunInterrupted, KeyboardInterrupt) as err:
        stopped = as_interrupted(err)
        duration = engine.clock()  # the run's clock: the wall's, or a simulated device's
        for r in pending:
            if not r.finished:
                r.fail(INTERRUPTED, duration)
                generations(r)
    finally:
        progress.close()
        step_writer.close()
    generations.finish()
    return duration, stopped


def device_metrics(engine: Engine) -> dict[str, Any]:
    """What a simulated run predicts beyond the serving metrics: the device, the graphs
    warmup would compile and how long that takes, and the compiles during serving."""
    if engine.simulation is None:  # a device that computes its steps predicts nothing
        return {"simulated": False}
    # Graphs, as warmup_plan logs them.
    return engine.simulation.metrics(sum(engine.warmup_counts().values()))
