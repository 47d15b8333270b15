"""What a server derives from its config before anything is built: the name /v1/models
lists, and the KV pool's size from a memory budget (a server has no workload to size it by).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError, describe_model, mem_available
from pipeline.schema import ServeConf, schema_view
from stages.scheduling.kv_cache import blocks_for


def serve_settings(cfg: DictConfig) -> ServeConf:
    """`serve.*` as its schema's object, made once where the server starts and handed to
    what reads it (the routes read it on every request)."""
    return cast(ServeConf, OmegaConf.to_object(cfg.serve))


def model_name(cfg: DictConfig, choice: str) -> str:
    """serve.model_name, or a GGUF file's `general.name` (else its file name), or the model
    group's choice."""
    named = schema_view(cfg).serve.model_name
    if named:
        return str(named)
    path = cfg.model.get("path") if choice == "gguf" else None
    if not path:
        return choice
    from stages.loading.gguf.reader import read_gguf_header

    try:
        name = read_gguf_header(path).metadata.get("general.name")
    except ValueError:
        name = None  # the build names the problem with the file
    if isinstance(name, str) and name.strip():
        return re.sub(r"\s+", "-", name.strip())
    return Path(str(path)).stem


def kv_budget_bytes(settings: ServeConf) -> tuple[int, str]:
    """The KV pool's memory, and where the figure comes from."""
    if settings.kv_cache_memory_gb < 0 or not 0 < settings.kv_cache_memory_fraction <= 1:
        raise ConfigError(
            "serve.kv_cache_memory_gb must be >= 0 (0 = a fraction of the available memory) "
            "and serve.kv_cache_memory_fraction in (0, 1]"
        )
    if settings.kv_cache_memory_gb:
        gb = settings.kv_cache_memory_gb
        return int(gb * 2**30), f"serve.kv_cache_memory_gb={gb:g}"
    available = mem_available() or 8 * 2**30
    fraction = settings.kv_cache_memory_fraction
    return int(available * fraction), (
        f"serve.kv_cache_memory_fraction={fraction:g} of {available / 2**30:.1f} GiB available"
    )


def kv_pool_blocks(cfg: DictConfig, most: int = 0) -> tuple[int, str]:
    """num_blocks for a server on the real executor: what the memory budget holds, at most
    `most` (0: what max_num_seqs full-length requests take); and the line that says so."""
    spec, _ = describe_model(cfg)
    conf = schema_view(cfg)
    block_size, max_model_len = conf.block_size, conf.max_model_len
    per_block = block_size * spec.kv_bytes_per_token()
    per_seq = blocks_for(max_model_len, block_size)
    budget, source = kv_budget_bytes(serve_settings(cfg))
    blocks = min(most or conf.max_num_seqs * per_seq, budget // per_block)
    if blocks < per_seq:
        raise ConfigError(
            f"the KV budget ({source}: {budget / 2**30:.3g} GiB) holds {blocks} blocks of "
            f"{block_size} tokens, and one request of max_model_len={max_model_len} "
            f"needs {per_seq}: raise serve.kv_cache_memory_gb or lower max_model_len"
        )
    line = (
        f"KV cache: {blocks} blocks of {block_size} tokens, "
        f"{blocks * per_block / 2**30:.3g} GiB ({source}; "
        f"{blocks // per_seq} requests of max_model_len={max_model_len} at once)"
    )
    return int(blocks), line


def size_kv_pool(cfg: DictConfig, most: int) -> str | None:
    """Fills in num_blocks where the config leaves it to be derived, at most `most` (the
    executor's server pool; 0: the build sizes it, as a simulated device does); the line to
    print. With warmup=true the pool is the batch run's (derived from the configured
    workload), so the server warms the same graphs as `python -m pipeline` with the same
    overrides."""
    conf = schema_view(cfg)
    if not most or conf.num_blocks or conf.warmup:
        return None
    cfg.num_blocks, line = kv_pool_blocks(cfg, most)
    return line
