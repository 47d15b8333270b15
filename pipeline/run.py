"""Builds the stages from a composed config, serves the workload, writes the run folder."""

from __future__ import annotations

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
from pipeline.checks import ConfigError, check_config
from pipeline.engine import Engine
from pipeline.metrics import StepRecord, summarise
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
    # A checkpoint's config and generation config name its end tokens too.
    eos_ids = tokenizer.eos_ids | model.eos_ids
    dims = model.dims
    attention = build(
        cfg.attention,
        num_blocks=num_blocks,
        num_layers=dims.num_layers,
        num_kv_heads=dims.num_kv_heads,
        head_dim=dims.head_dim,
        dtype=model.dtype,
    )
    check_attention_ops(model, attention, cfg.attention.get("ops"))
    engine = Engine(
        tokenizer=tokenizer,
        scheduler=build(cfg.scheduler, num_blocks=num_blocks, eos_ids=eos_ids),
        metadata=build(cfg.metadata, num_blocks=num_blocks, pad_id=tokenizer.pad_id),
        model=model,
        attention=attention,
        sampler=build(cfg.sampler),
    )
    return engine, requests


def check_attention_ops(model: Any, attention: Any, ops_name: str | None) -> None:
    """A model that norms each query and key head needs ops that can (the HPU's cannot)."""
    ops = getattr(attention, "ops", None)  # the dense reference has no backend: it can
    if model.has_qk_norm and ops is not None and not getattr(ops, "supports_qk_norm", False):
        raise ConfigError(
            f"attention.ops={ops_name} has no fused q/k norm, which this model needs "
            "(per-head RMSNorm of queries and keys, as in Qwen3): set attention.ops=cpu"
        )


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    check_resolves(cfg)
    artefacts.write_resolved_config(cfg, out_dir)
    engine, requests = build_engine(cfg)
    tokenizer = engine.tokenizer
    num_blocks = engine.scheduler.pool.num_blocks
    log.info(
        "pipeline_ready",
        requests=len(requests),
        model_parameters=engine.model.num_parameters,
        num_blocks=num_blocks,
        max_tokens=cfg.max_tokens,
        block_size=cfg.block_size,
    )

    steps: list[StepRecord] = []
    writer = artefacts.StepWriter(out_dir)
    bar = tqdm(total=len(requests), unit="req", desc="requests", disable=None, leave=False)
    produced, elapsed = 0, 0.0

    def on_step(record: StepRecord) -> None:
        nonlocal produced, elapsed
        steps.append(record)
        writer(record)
        produced += len(record.decode) + len(record.prefill)
        elapsed += record.duration_s  # a running total: summing every step each step is O(n^2)
        bar.set_postfix(step=record.step, tok_s=f"{produced / elapsed:.0f}" if elapsed else "-")

    warmup_s = engine.warmup() if cfg.warmup else 0.0
    status, duration = "ok", 0.0
    try:
        duration = engine.run(requests, on_step=on_step, on_finish=lambda r: bar.update(1))
    except KeyboardInterrupt:
        status = "interrupted"
        for r in requests:
            if not r.finished:
                r.fail("the run was interrupted before this request finished", r.arrival_s)
    finally:
        bar.close()
        writer.close()
        artefacts.write_generations(requests, tokenizer, out_dir)

    metrics = {
        "status": status,
        **summarise(requests, steps, duration),
        "bucket_misses": engine.metadata.bucket_misses,
        "warmup_s": warmup_s,
    }
    artefacts.write_metrics(metrics, out_dir)
    log.info(
        "run_finished",
        status=status,
        duration_s=round(duration, 3),
        output_throughput=round(metrics["output_throughput"], 1),
        errors=metrics["num_errors"],
        out_dir=str(out_dir),
    )
    return metrics
