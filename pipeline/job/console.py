"""What a run shows on the terminal: a progress bar while it serves, a short table at the end."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from pipeline.run_folder.records import StepRecord


class Progress:
    """Requests finished, and tokens per second of step time: prefill chunk tokens plus
    decodes, the work the steps did."""

    def __init__(self, num_requests: int) -> None:
        self._bar = tqdm(total=num_requests, unit="req", desc="requests", disable=None, leave=False)
        self._tokens, self._seconds = 0, 0.0  # running totals: re-summing steps is O(n^2)

    def on_step(self, record: StepRecord) -> None:
        self._tokens += record.num_tokens
        self._seconds += record.duration_s
        if self._bar.disable:  # no terminal: the figures would go nowhere
            return
        rate = f"{self._tokens / self._seconds:.0f}" if self._seconds else "-"
        self._bar.set_postfix(step=record.step, tok_s=rate)

    def on_finish(self) -> None:
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _ms(metrics: Mapping[str, Any], key: str, stat: str) -> str:
    value = (metrics.get(key) or {}).get(stat)
    return "-" if value is None else f"{value:.1f} ms"


def summary_table(metrics: Mapping[str, Any]) -> str:
    """The headline figures of a run, one per line."""
    utilization = metrics.get("token_utilization")
    hit_rate = metrics.get("prefix_cache_hit_rate")
    rows = [
        ("requests", f"{metrics['num_requests']} ({metrics['num_errors']} errors)"),
        ("output throughput", f"{metrics['output_throughput']:.1f} tok/s"),
        ("TTFT p50 / p99", f"{_ms(metrics, 'ttft_ms', 'p50')} / {_ms(metrics, 'ttft_ms', 'p99')}"),
        ("TPOT p50", _ms(metrics, "tpot_ms", "p50")),
        ("ITL p99", _ms(metrics, "itl_ms", "p99")),
        ("token utilization", "-" if utilization is None else f"{utilization:.2f}"),
        ("prefix cache hits", "-" if hit_rate is None else f"{hit_rate:.0%} of prompt tokens"),
        ("bucket misses", str(metrics.get("bucket_misses", 0))),
        ("preemptions", str(metrics.get("num_preemptions", 0))),
        *speculation_rows(metrics),
        *slo_rows(metrics),
        *compile_rows(metrics),
        *warmup_rows(metrics),
        *workload_rows(metrics),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def speculation_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A simulated run's speculation: its method, k and expected tokens a step."""
    method = metrics.get("speculative_method")
    if method is None:
        return []
    k, tokens = metrics["speculative_tokens"], metrics["speculative_expected_tokens"]
    rate = metrics.get("speculative_proposal_rate", 1.0)  # absent from earlier folders
    proposing = f", proposals for {rate:.0%} of rows" if rate < 1.0 else ""
    return [
        ("speculative", f"{method}, k={k}{proposing}: {tokens:.2f} tokens a decode row and step")
    ]


def slo_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Goodput and attainment, when the run had an SLO (a bound other than 0)."""
    slo = dict(metrics.get("slo") or {})
    target = slo.pop("attainment", None)
    if not slo or metrics.get("slo_attainment") is None:
        return []
    bounds = ", ".join(f"{name[:-3]} <= {bound:g} ms" for name, bound in slo.items())
    verdict = "met" if metrics.get("slo_met") else "NOT met"
    by_bound = metrics.get("slo_attainment_by_bound") or {}
    each = ", ".join(f"{name[:-3]} {value:.0%}" for name, value in by_bound.items())
    return [
        ("SLO", bounds),
        ("SLO attainment", f"{metrics['slo_attainment']:.1%} ({verdict}: target {target:.0%})"),
        ("  per bound", each),
        ("goodput", f"{metrics.get('request_goodput', 0.0):.3f} req/s"),
    ]


def compile_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Graphs a simulated device compiled while serving: time the requests waited for."""
    compiles = metrics.get("serving_compiles")
    if not compiles:
        return []
    seconds = metrics.get("serving_compile_s") or 0.0
    share = seconds / metrics["duration_s"] if metrics.get("duration_s") else 0.0
    return [
        (
            "compiles while serving",
            f"{compiles} graphs, {seconds:,.1f} s predicted ({share:.0%} of the run): "
            + (
                "the warmed set leaves these shapes out (bucket misses, or the engine's grid "
                "stops short: metadata.bucketing, metadata.fastdeploy.*)"
                if metrics.get("warmup_s")
                else "warmup=true compiles them before serving"
            ),
        )
    ]


HOUR_S = 3600.0


def warmup_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The graphs warmup compiles and its time: predicted on a simulated device (whether
    or not the run warmed), measured when a real run warmed; a warning past an hour."""
    graphs = metrics.get("warmup_shapes")
    predicted = metrics.get("predicted_warmup_s")
    if predicted is not None:
        seconds, how = float(predicted), "predicted"
    elif metrics.get("warmup_s"):
        seconds, how = float(metrics["warmup_s"]), "measured"
    else:
        return [] if graphs is None else [("warmup", f"{graphs:,} graphs (warmup=false)")]
    shown = f"{seconds / HOUR_S:.1f} h" if seconds >= HOUR_S else f"{seconds:,.1f} s"
    count = "" if graphs is None else f"{graphs:,} graphs, "
    rows = [("warmup", f"{count}{shown} {how}")]
    if seconds > HOUR_S:
        rows.append(
            (
                "  WARNING",
                "warmup takes over an hour: plan a smaller set (python -m pipeline.buckets "
                "plan --workload ...) or set metadata.bucketing=exponential",
            )
        )
    return rows


def workload_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Trace prompts cut to max_model_len - 1 or refused: the run served other prompts
    than the trace's, so every figure is for them."""
    counts = metrics.get("workload_counts") or {}
    clipped, rejected = int(counts.get("clipped", 0)), int(counts.get("rejected", 0))
    if not (clipped or rejected):
        return []
    limit = metrics.get("max_model_len")
    where = f"max_model_len={limit}" if limit else "max_model_len"
    return [
        (
            "prompts cut",
            f"{clipped} clipped, {rejected} rejected by {where}: every figure is for the cut "
            f"workload; {raise_advice(metrics.get('max_position_embeddings'))}",
        )
    ]


def raise_advice(context: int | None) -> str:
    """What to do about prompts cut by max_model_len, with the model's own context length
    where its description states one."""
    if context:
        return f"raise max_model_len (the model allows up to {context:,})"
    return "raise max_model_len toward the model's context length"
