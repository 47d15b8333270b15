"""The schema of `python -m pipeline.serve`'s own keys (`serve.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeConf:
    """`python -m pipeline.serve`: the OpenAI-compatible server's knobs."""

    host: str = "127.0.0.1"  # 0.0.0.0 listens on every interface
    port: int = 8000
    api_key: str = ""  # a Bearer token /v1 routes require; empty = none
    # Host header names answered (DNS rebinding: a page's own name resolved to 127.0.0.1);
    # empty = the loopback names where host is loopback, any elsewhere; "*" = any
    allowed_hosts: list[str] = field(default_factory=list)
    model_name: str = ""  # the name /v1/models lists; empty = the model group's choice
    max_waiting: int = 256  # requests queued (not yet running) at most; beyond: 503
    max_request_bytes: int = 1_000_000  # larger request bodies get 413
    shutdown_timeout_s: float = 30.0  # SIGTERM: in-flight requests finish or abort by then
    header_timeout_s: float = 10.0  # a connection whose request head is not in by then closes
    body_timeout_s: float = 30.0  # a body not all in by then gets 408
    max_connections: int = 1000  # open connections at most; beyond: 503 (uvicorn's limit)
    # The KV pool's memory (executor=paddle): serve.kv_cache_memory_gb (vLLM's CPU backend
    # takes a fixed budget too), or with 0 this fraction of the memory available at start
    # (vLLM's gpu_memory_utilization); never more blocks than max_num_seqs full-length
    # requests take. num_blocks, where given, wins.
    kv_cache_memory_gb: float = 1.0
    kv_cache_memory_fraction: float = 0.1
    # Free C heap handed back to the system at most this often (glibc's malloc_trim), so
    # the resident size stays flat over days; 0 = never.
    trim_memory_s: float = 60.0
