"""Builds the stages from a composed config, serves the workload, writes the run folder."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paddle
import structlog
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue
from tqdm import tqdm

from pipeline import artefacts
from pipeline.allocator import keep_freed_memory
from pipeline.artefacts import INTERRUPTED
from pipeline.checks import ConfigError, check_config, check_memory
from pipeline.engine import Engine
from pipeline.metrics import StepRecord, summarise
from pipeline.resume import Previous, load_previous, pending_requests
from pipeline.stopping import RunInterrupted, as_interrupted, stop_on_signals
from stages.block_pool import blocks_for
from stages.request import Request

log = structlog.get_logger(__name__)


def build(node: DictConfig, **runtime: Any) -> Any:
    """Instantiates one stage; a constructor's ValueError becomes a one-line config error."""
    try:
        return instantiate(node, **runtime)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ValueError):
            raise ConfigError(str(cause)) from err
        raise


def check_resolves(cfg: DictConfig) -> None:
    """Every key is set and every interpolation resolves (e.g. model.path for model=hf, and
    tokenizer.path, which defaults to it), or one line names the key."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is not set: give {err.full_key}=...") from err
    except InterpolationResolutionError as err:
        reason = str(err.msg).splitlines()[0]
        raise ConfigError(
            f"{err.full_key} does not resolve ({reason}): give {err.full_key}=..."
        ) from err


def derive_num_blocks(cfg: DictConfig, requests: list[Request]) -> int:
    """Enough blocks that no request is ever preempted, and no more than the workload needs."""
    per_seq = blocks_for(cfg.max_model_len, cfg.block_size)
    workload = sum(
        blocks_for(
            min(len(r.prompt_ids) + max(r.max_new_tokens, 0), cfg.max_model_len), cfg.block_size
        )
        for r in requests
    )
    return max(1, min(cfg.max_num_seqs * per_seq, workload))


def build_engine(cfg: DictConfig) -> tuple[Engine, list[Request]]:
    """Checks the config, builds every stage and loads the workload."""
    check_resolves(cfg)
    check_config(cfg)
    keep_freed_memory()
    paddle.set_device(cfg.device)
    paddle.base.core.set_num_threads(cfg.num_threads)
    tokenizer = build(cfg.tokenizer)
    model = build(cfg.model)
    if model.dims.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model.dims.vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size}: pick a matching model and tokenizer"
        )
    requests = build(cfg.workload).load(tokenizer)
    num_blocks = cfg.num_blocks or derive_num_blocks(cfg, requests)
    check_memory(cfg, num_blocks)
    # A checkpoint's config and generation config name its end tokens too.
    eos_ids = tokenizer.eos_ids | model.eos_ids
    dims = model.dims
    engine = Engine(
        tokenizer=tokenizer,
        scheduler=build(cfg.scheduler, num_blocks=num_blocks, eos_ids=eos_ids),
        metadata=build(cfg.metadata, num_blocks=num_blocks, pad_id=tokenizer.pad_id),
        model=model,
        attention=build(
            cfg.attention,
            num_blocks=num_blocks,
            num_layers=dims.num_layers,
            num_kv_heads=dims.num_kv_heads,
            head_dim=dims.head_dim,
            dtype=model.dtype,
        ),
        sampler=build(cfg.sampler),
    )
    return engine, requests


def run(cfg: DictConfig, out_dir: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Serves the workload into `out_dir`; with `resume=RUN_DIR`, completes that folder
    instead, with its own config (`overrides` are the command line's, checked against it).
    A stop signal raises RunInterrupted once the folder is written."""
    with stop_on_signals():
        check_resolves(cfg)
        previous = None
        if cfg.get("resume"):
            previous = load_previous(cfg.resume, overrides)
            cfg, out_dir = previous.cfg, previous.folder
            check_resolves(cfg)
            problem = artefacts.run_folder_problem(out_dir)
            if problem:
                raise ConfigError(problem)
        else:
            artefacts.write_resolved_config(cfg, out_dir)
        engine, requests = build_engine(cfg)
        return serve(cfg, engine, requests, out_dir, previous)


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
        num_blocks=engine.scheduler.pool.num_blocks,
        max_tokens=cfg.max_tokens,
        block_size=cfg.block_size,
    )
    steps: list[StepRecord] = list(previous.steps) if previous else []
    first_step = len(steps)
    step_writer = artefacts.StepWriter(out_dir, append=previous is not None)
    generations = artefacts.GenerationWriter(
        out_dir, engine.tokenizer, previous.kept.values() if previous else ()
    )
    bar = tqdm(total=len(pending), unit="req", desc="requests", disable=None, leave=False)
    produced, elapsed = 0, 0.0

    def on_step(record: StepRecord) -> None:
        nonlocal produced, elapsed
        record.step += first_step  # a resumed folder's steps go on from the earlier ones
        steps.append(record)
        step_writer(record)
        produced += len(record.decode) + len(record.prefill)
        elapsed += record.duration_s  # a running total: summing every step each step is O(n^2)
        bar.set_postfix(step=record.step, tok_s=f"{produced / elapsed:.0f}" if elapsed else "-")

    def on_finish(request: Request) -> None:
        generations(request)
        bar.update(1)

    warmup_s = engine.warmup() if cfg.warmup else 0.0
    stopped: RunInterrupted | None = None
    start = time.perf_counter()
    try:
        duration = engine.run(pending, on_step=on_step, on_finish=on_finish)
    except (RunInterrupted, KeyboardInterrupt) as err:
        stopped = as_interrupted(err)
        duration = time.perf_counter() - start
        for r in pending:
            if not r.finished:
                r.fail(INTERRUPTED, duration)
                generations(r)
    finally:
        bar.close()
        step_writer.close()
    generations.finish()
    status = "interrupted" if stopped else "ok"
    metrics = {
        "status": status,
        **summarise(requests, steps, duration + (previous.duration_s if previous else 0.0)),
        "bucket_misses": engine.metadata.bucket_misses,
        "warmup_s": warmup_s,
    }
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
    if stopped:
        stopped.recorded = True
        raise stopped
    return metrics
