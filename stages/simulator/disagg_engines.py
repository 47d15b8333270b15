"""Each engine's disaggregated path, as its sources describe it: the router's hop before a
request reaches a prefill instance, how the client's first token is made, whether the
decode instance pulls the KV cache while it keeps stepping or stops to pull it, and how
the KV cache is cut into pieces. One table keyed by the deploy engine names, which are
the engine profiles' (`engine=`, conf/engine/: a deployment takes its run's engine's path
unless `disagg.engine` names another), with one row more for the engine the published
measurements of benchmarks/published_disagg.py ran (`triton-distributed`).

The router's hop comes before the prefill instance sees the request, and again before the
decode instance does where the router sends the decode request only once the prefill's
reply reached it (`reply_first`); streaming back through the router delays every token
alike, so ITL does not count it. What routers
do under load (one waiting for the prefill instance's reply before it streams the decode
instance's) is not modelled.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FirstToken(enum.Enum):
    """Where the client's first token comes from."""

    # The decode instance computes the last prompt token again and samples it: one step.
    RECOMPUTED = "recomputed"
    # The prefill instance's token travels with the KV cache; the decode instance sends it
    # when it takes the request in.
    CARRIED = "carried"


@dataclass(frozen=True)
class DisaggPath:
    router_s: float  # the router's hop
    first_token: FirstToken
    # True: the decode instance pulls the KV cache inside a step of its own, its running
    # requests waiting; False: the pull runs beside its steps, the request joins on arrival.
    pull_blocks: bool
    # True: a piece per KV block of each layer's keys or values (paged descriptors);
    # False: keys and values packed, one piece each per source device.
    paged: bool
    source: str
    # True: the router sends the decode request once the prefill instance's reply reached
    # it (the reply names the KV blocks to pull), so its hop comes twice before the pull
    reply_first: bool = False


VLLM_PROXY = (
    "router: a Python HTTP relay; llm-d's routing sidecar before vLLM's NixlConnector "
    "measured 0.1-5 ms by concurrency (github.com/inference-sim/inference-sim/issues/998), "
    "2 ms assumed"
)


def assumed_as_sglang(router: str) -> DisaggPath:
    """An engine whose path no source found: SGLang's, behind a Python router (`router`)
    whose hop is taken as vLLM's proxy's."""
    return DisaggPath(
        0.002, FirstToken.CARRIED, pull_blocks=False, paged=True,
        source=f"assumed as SGLang's path behind a Python router ({router}) with vLLM's "
        "proxy's hop: no figure found",
    )  # fmt: skip


DISAGG_ENGINES: dict[str, DisaggPath] = {
    "vllm": DisaggPath(
        0.002, FirstToken.RECOMPUTED, pull_blocks=False, paged=True,
        source=f"{VLLM_PROXY}; the decode instance recomputes the token the prefill already "
        "sampled (github.com/vllm-project/vllm/pull/51919) after NixlConnector's "
        "asynchronous pull of one descriptor per block and layer "
        "(github.com/vllm-project/vllm/issues/50913); the proxy sends the decode request "
        "with the kv_transfer_params of the prefill's reply (tests/v1/kv_connector/"
        "nixl_integration/toy_proxy_server.py; vllm-router's --vllm-pd-disaggregation)",
        reply_first=True,
    ),
    "sglang": DisaggPath(
        0.0005, FirstToken.CARRIED, pull_blocks=False, paged=True,
        source="router: sglang_router, in Rust, 0.5 ms assumed (no figure found); the decode "
        "server polls the transfer beside its batches and merges the request into the "
        "running batch, skipping the prefill forward (sgl-project/sglang "
        "python/sglang/srt/disaggregation/decode.py)",
    ),
    "trtllm": DisaggPath(
        0.002, FirstToken.CARRIED, pull_blocks=False, paged=True,
        source="trtllm-serve disaggregated (NVIDIA/TensorRT-LLM tensorrt_llm/serve/"
        "openai_disagg_server.py): the context server's reply, its first token and "
        "disaggregated_params, comes back before the generation request is sent; its "
        "Python server's hop, the token's carrying and the pieces assumed as vLLM's proxy "
        "and SGLang's",
        reply_first=True,
    ),
    "fastdeploy": assumed_as_sglang("FastDeploy's splitwise scheduler"),
    "triton-distributed": DisaggPath(
        0.002, FirstToken.CARRIED, pull_blocks=True, paged=False,
        source="Triton Distributed's vLLM 0.6.3 patch (triton-inference-server/"
        "triton_distributed, container/deps/vllm): the generate worker runs no forward for "
        "a new request but pulls its KV cache inside its model runner's step and returns "
        "the context worker's first token (examples/llm/vllm/operators/vllm_disaggregated/"
        "pipelines.py: set_first_token); data_plane/kv_cache.py stacks each request's keys "
        "and values over the layers into one tensor each per receiving rank; its Python API "
        "server's hop assumed as vLLM's proxy",
    ),
}  # fmt: skip


def disagg_path(engine: str) -> DisaggPath:
    """The path of `engine`; a one-line error naming the choices for any other name."""
    if engine not in DISAGG_ENGINES:
        names = ", ".join(sorted(DISAGG_ENGINES))
        raise ValueError(f"disagg.engine={engine!r}: give one of {names}")
    return DISAGG_ENGINES[engine]
