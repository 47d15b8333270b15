"""What a request may never exceed under a scheduler's limits: a request that breaks one is
failed at once with the reason, never queued."""

from __future__ import annotations

from stages.scheduling.chunk_policy import ChunkPolicy
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request


def rejection(
    request: Request, max_model_len: int, chunks: ChunkPolicy, kv_cache: KVCacheManager
) -> str | None:
    """Why this request can never be served under these limits, or None."""
    n = len(request.prompt_ids)
    if not request.prompt_ids:  # tokens, not text: special tokens decode to none
        return "empty prompt"
    if request.max_new_tokens < 1:
        return f"max_new_tokens={request.max_new_tokens}: must be >= 1"
    if n >= max_model_len:
        return (
            f"prompt has {n} tokens, max_model_len={max_model_len} leaves no room "
            "for output: shorten the prompt or raise max_model_len"
        )
    too_long = chunks.one_step_error(n)
    if too_long:
        return f"prompt has {too_long}: raise max_tokens or use scheduler=chunked"
    needed = kv_cache.blocks_for(min(n + request.max_new_tokens, max_model_len))
    if needed > kv_cache.num_blocks:
        return (
            f"needs {needed} KV blocks of {kv_cache.block_size} tokens, the pool has "
            f"num_blocks={kv_cache.num_blocks}: raise num_blocks (0 derives it)"
        )
    return None
