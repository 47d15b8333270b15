"""The router's hop in a disaggregated deployment: what the component that joins the pools
(vLLM's proxy, SGLang's router, trtllm-serve's disaggregated server, FastDeploy's
splitwise scheduler) adds to a request's first token, keyed by the deploy engine names
(pipeline/deploy/flags.py). The figure is added once, before the prefill instance sees
the request; streaming back through it delays every token alike, so ITL is unchanged.

Each figure with its source or, where none was found, the assumption it stands for.
What routers do under load (a router waiting for the prefill instance's reply before it
streams the decode instance's) is not modelled.
"""

from __future__ import annotations

# engine -> (seconds, source or assumption)
ROUTER_HOP_S: dict[str, tuple[float, str]] = {
    "vllm": (
        0.002,
        "a Python HTTP relay: llm-d's routing sidecar in front of vLLM's NixlConnector "
        "measured 0.1-5 ms by concurrency (github.com/inference-sim/inference-sim/issues/998); "
        "2 ms assumed for vLLM's toy_proxy_server, which sends the prefill and decode "
        "requests in series",
    ),
    "sglang": (
        0.0005,
        "assumed: sglang_router is a Rust HTTP router (sgl-project/sglang "
        "docs/advanced_features/pd_disaggregation.md) that sends both requests at once; "
        "no published per-request figure was found",
    ),
    "trtllm": (
        0.002,
        "assumed as vLLM's proxy: trtllm-serve disaggregated is a Python HTTP server that "
        "sends the context request, then the generation request; no figure was found",
    ),
    "fastdeploy": (
        0.002,
        "assumed as vLLM's proxy: FastDeploy's splitwise scheduler routes through a Python "
        "API server; no figure was found",
    ),
}


def router_hop_s(engine: str, override_s: float = -1.0) -> float:
    """The hop of `engine`'s router, or `override_s` where it is >= 0."""
    if engine not in ROUTER_HOP_S:
        names = ", ".join(sorted(ROUTER_HOP_S))
        raise ValueError(f"disagg.router={engine!r}: give one of {names}")
    return override_s if override_s >= 0 else ROUTER_HOP_S[engine][0]
