"""A disaggregated request's time to first token as a client reads it, in its parts: the
router's hops (before the prefill instance, and before the decode instance where the
router waits for the prefill's reply), the prefill instance (its queue and the prompt),
the KV transfer beside the decode instance's steps, and the decode instance (its wait for
room, the pull where it makes the pull itself, and the first step or the carried token's
sending). The parts add up to the request's TTFT; each is read off the request's two
copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.job.metrics import stats
from stages.scheduling.request import Request

PARTS = ("router", "prefill", "transfer", "decode")


def ttft_parts_s(
    served: Sequence[tuple[Request, Request | None]], hops_s: tuple[float, float]
) -> dict[str, list[float]]:
    """Each part's seconds, for every request whose decode copy produced a token (`hops_s`:
    the router's before each pool's instance)."""
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    for first, rest in served:
        if rest is None or not rest.token_times or not first.token_times:
            continue
        prefilled = first.token_times[0]
        parts["router"].append(hops_s[0] + hops_s[1])
        parts["prefill"].append(prefilled - first.arrival_s)
        parts["transfer"].append(rest.arrival_s - prefilled - hops_s[1])
        parts["decode"].append(rest.token_times[0] - rest.arrival_s)
    return parts


def ttft_parts_ms(
    served: Sequence[tuple[Request, Request | None]], hops_s: tuple[float, float]
) -> dict[str, dict[str, float | None]]:
    """metrics.json's `disagg.ttft_parts_ms`: each part's statistics in milliseconds."""
    parts = ttft_parts_s(served, hops_s)
    return {part: stats([s * 1e3 for s in values]) for part, values in parts.items()}


def describe_parts(parts: dict[str, Any]) -> str:
    """The summary's line: TTFT's parts at their medians (means, for a run of few)."""

    def ms(part: str) -> str:
        p50 = parts[part]["p50"]
        return "-" if p50 is None else f"{p50:.1f}"

    return (
        f"  TTFT parts  p50 router {ms('router')} + prefill {ms('prefill')} + KV transfer "
        f"{ms('transfer')} + decode instance {ms('decode')} ms"
    )
