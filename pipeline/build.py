"""Builds the stages from a composed config: the real pipeline or a simulated device."""

from __future__ import annotations

import signal
import threading
from typing import Any

import structlog
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from pipeline.checks import (
    ConfigError,
    check_config,
    check_memory,
    check_model_context,
    describe_model,
)
from pipeline.engine import Engine
from pipeline.expansion import check_expansion
from pipeline.schema import Executor
from stages.interfaces import Attention, Tokenizer, Workload
from stages.kv_cache import KVCacheManager, blocks_for
from stages.request import Request
from stages.simulator.device import (
    NoAttention,
    SimulatedDevice,
    VirtualClock,
    WorkloadLengthSampler,
    pick_token,
)
from stages.simulator.expert_parallel import ExpertParallel, check_layout
from stages.simulator.hardware import HardwareProfile, kv_pool_blocks
from stages.simulator.precision import Precision
from stages.stopping import StopRule
from stages.workload import bound_arrivals

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
    tokenizer.path, which defaults to it), or one line names the key; no value may expand
    beyond bounds through what it refers to."""
    check_expansion(cfg)
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


def load_workload(cfg: DictConfig, tokenizer: Tokenizer) -> tuple[Workload, list[Request]]:
    """The workload and its requests, every arrival held to the one bound."""
    workload: Workload = build(cfg.workload)
    try:
        requests = workload.load(tokenizer)
    except OSError as err:  # its file removed or made unreadable since it was checked
        raise ConfigError(
            f"workload: {err.filename or 'its file'} cannot be read ({err.strerror or err}): "
            "check workload.path"
        ) from err
    bound_arrivals(requests)
    return workload, requests


def build_engine(
    cfg: DictConfig, clock: VirtualClock | None = None
) -> tuple[Engine, list[Request]]:
    """Checks the config, builds every stage and loads the workload. clock: a simulated
    device's, virtual by default (a server paces it in real time)."""
    check_resolves(cfg)
    check_config(cfg)
    if cfg.executor.name == Executor.simulated:
        return build_simulated_engine(cfg, clock or VirtualClock())
    return build_paddle_engine(cfg)


def import_paddle() -> None:
    """Loads Paddle, which a simulated run never does. Loading it installs Paddle's own
    C-level handlers for SIGINT, SIGTERM and other signals, which end the process: the
    Python handlers in place are put back, and a command loads Paddle before installing
    its own (a thread that is not the main one cannot put them back)."""
    stops = (signal.SIGINT, signal.SIGTERM)
    handlers = {s: signal.getsignal(s) for s in stops}
    import paddle  # noqa: F401

    if threading.current_thread() is threading.main_thread():
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


def build_paddle_engine(cfg: DictConfig) -> tuple[Engine, list[Request]]:
    """The real pipeline: tensors in Paddle, imported here only (a simulated run has none)."""
    import_paddle()
    import paddle

    from pipeline.allocator import keep_freed_memory

    keep_freed_memory()
    paddle.set_device(cfg.device)
    paddle.base.core.set_num_threads(cfg.num_threads)
    tokenizer = build(cfg.tokenizer)
    model = build(cfg.model)
    if model.spec.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model.spec.vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size}: pick a matching model and tokenizer"
        )
    workload, requests = load_workload(cfg, tokenizer)
    kv_cache = build_kv_cache(cfg, requests)
    # A checkpoint's config and generation config name its end tokens too.
    stop = StopRule(tokenizer.eos_ids | model.eos_ids, cfg.max_model_len, tokenizer.decode)
    dims = model.spec
    attention = build(
        cfg.attention,
        kv_cache=kv_cache,
        num_layers=dims.num_layers,
        num_kv_heads=dims.num_kv_heads,
        head_dim=dims.head_dim,
        dtype=model.dtype,
    )
    try:
        attention.load_weights(model)
    except ValueError as err:  # e.g. a q/k-normed model on ops that have no q/k norm
        raise ConfigError(str(err)) from err
    engine = Engine(
        tokenizer=tokenizer,
        scheduler=build(cfg.scheduler, kv_cache=kv_cache, stop=stop),
        metadata=build(
            cfg.metadata,
            kv_cache=kv_cache,
            pad_id=tokenizer.pad_id,
            packed=attention.packs_rows,
        ),
        model=model,
        attention=attention,
        sampler=build(cfg.sampler),
        workload_counts=workload.counts,
        concurrency=workload.concurrency,
    )
    return engine, requests


def build_simulated_engine(
    cfg: DictConfig, clock: VirtualClock, hardware: HardwareProfile | None = None
) -> tuple[Engine, list[Request]]:
    """The real scheduler, KV-cache manager and metadata builder (shapes only) with a
    simulated device in place of the forward pass, on a virtual clock. `hardware`, when
    given, replaces the config's profile (a fit trying other figures)."""
    tokenizer = build(cfg.tokenizer)
    spec, _ = describe_model(cfg)
    check_model_context(cfg, spec)
    if cfg.hardware is None and hardware is None:
        raise ConfigError("executor=simulated needs a device: give hardware=gaudi3 (or ...)")
    hardware = hardware or build(cfg.hardware)
    workload, requests = load_workload(cfg, tokenizer)
    try:
        precision = Precision(cfg.quantization, cfg.kv_cache_dtype)
        parallel = ExpertParallel(cfg.ep, cfg.dp, cfg.ep_imbalance)
        check_layout(spec, cfg.tp, parallel)
        num_blocks = cfg.num_blocks or kv_pool_blocks(
            spec, hardware, cfg.block_size, cfg.tp, precision, parallel
        )
        split = cfg.executor.prefill_batch_split
        device = SimulatedDevice(spec, hardware, clock, cfg.tp, precision, split, parallel)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    kv_cache = KVCacheManager(num_blocks, cfg.block_size, cfg.prefix_caching)
    stop = StopRule((), cfg.max_model_len)  # output lengths come from the workload
    engine = Engine(
        tokenizer=tokenizer,
        scheduler=build(cfg.scheduler, kv_cache=kv_cache, stop=stop),
        metadata=build(cfg.metadata, kv_cache=kv_cache, pad_id=tokenizer.pad_id, shapes_only=True),
        model=device,
        attention=NoAttention(),
        sampler=WorkloadLengthSampler(pick_token(tokenizer.eos_ids, tokenizer.vocab_size)),
        clock=clock,
        workload_counts=workload.counts,
        record_lengths=False,
        concurrency=workload.concurrency,
    )
    return engine, requests


def build_kv_cache(cfg: DictConfig, requests: list[Request]) -> KVCacheManager:
    """The block pool; prefix caching where the attention stage reads a paged cache (the
    dense oracle keeps each request's keys apart, so it has nothing to share)."""
    attention: type[Attention] = get_class(cfg.attention._target_)
    caching = cfg.prefix_caching and attention.supports_prefix_caching
    num_blocks = cfg.num_blocks or derive_num_blocks(cfg, requests)
    check_memory(cfg, num_blocks)  # before anything large is allocated
    try:
        return KVCacheManager(num_blocks, cfg.block_size, caching)
    except ValueError as err:
        raise ConfigError(str(err)) from err
