"""The Paddle executor: the real forward pass, each step's tokens computed in tensors."""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig

from pipeline.config.checks import (
    ConfigError,
    check_has_weights,
    check_memory,
    check_paddle_device,
)
from pipeline.config.executor_keys import refuse_others_keys
from pipeline.executors.build import build, import_paddle, load_workload
from pipeline.job.engine import Engine
from pipeline.schema import Executor, schema_view
from stages.interfaces import Attention
from stages.scheduling.kv_cache import KVCacheManager, blocks_for
from stages.scheduling.request import Request
from stages.scheduling.stopping import StopRule


class PaddleExecutor:
    needs_paddle = True
    predicts = False  # each step's time is the wall's

    def check(self, cfg: DictConfig) -> None:
        check_has_weights(cfg)
        refuse_others_keys(cfg, Executor.paddle)  # hardware, tp, disagg.*, speculative.*, ...
        check_paddle_device(cfg)  # num_threads, device, attention.ops
        check_memory(
            cfg, schema_view(cfg).num_blocks
        )  # a derived pool is checked again once it is known

    def server_num_blocks(self, cfg: DictConfig) -> int:
        """max_num_seqs requests of max_model_len tokens each."""
        conf = schema_view(cfg)
        return int(conf.max_num_seqs * blocks_for(conf.max_model_len, conf.block_size))

    def build(self, cfg: DictConfig, paced: bool = False) -> tuple[Engine, list[Request]]:
        """Every stage in Paddle, imported here only (a simulated run has none); the run's
        clock is the wall's, paced or not."""
        return build_paddle_engine(cfg)


def build_paddle_engine(cfg: DictConfig) -> tuple[Engine, list[Request]]:
    """The real pipeline: tensors in Paddle, imported here only (a simulated run has none)."""
    import_paddle()
    import paddle

    from pipeline.executors.allocator import keep_freed_memory

    keep_freed_memory()
    conf = schema_view(cfg)
    paddle.set_device(conf.device)
    paddle.base.core.set_num_threads(conf.num_threads)
    tokenizer, model = build(cfg.tokenizer), build(cfg.model)
    model.use_threads(conf.num_threads)  # its compiled operators' threads, beside Paddle's
    if model.spec.vocab_size < tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model.spec.vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size}: pick a matching model and tokenizer"
        )
    workload, requests = load_workload(cfg, tokenizer)
    kv_cache = build_kv_cache(cfg, requests)
    # A checkpoint's config and generation config name its end tokens too.
    stop = StopRule(tokenizer.eos_ids | model.eos_ids, conf.max_model_len, tokenizer.decode)
    attention = build(
        cfg.attention,
        kv_cache=kv_cache,
        num_layers=model.spec.num_layers,
        num_kv_heads=model.spec.num_kv_heads,
        head_dim=model.spec.head_dim,
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


def derive_num_blocks(cfg: DictConfig, requests: list[Request]) -> int:
    """Enough blocks that no request is ever preempted, and no more than the workload needs."""
    conf = schema_view(cfg)
    per_seq = blocks_for(conf.max_model_len, conf.block_size)
    workload = sum(
        blocks_for(
            min(len(r.prompt_ids) + max(r.max_new_tokens, 0), conf.max_model_len), conf.block_size
        )
        for r in requests
    )
    return max(1, min(conf.max_num_seqs * per_seq, workload))


def build_kv_cache(cfg: DictConfig, requests: list[Request]) -> KVCacheManager:
    """The block pool; prefix caching where the attention stage reads a paged cache (the
    dense oracle keeps each request's keys apart, so it has nothing to share)."""
    attention: type[Attention] = get_class(cfg.attention._target_)
    conf = schema_view(cfg)
    caching = conf.prefix_caching and attention.supports_prefix_caching
    num_blocks = conf.num_blocks or derive_num_blocks(cfg, requests)
    check_memory(cfg, num_blocks)  # before anything large is allocated
    try:
        return KVCacheManager(num_blocks, conf.block_size, caching)
    except ValueError as err:
        raise ConfigError(str(err)) from err
