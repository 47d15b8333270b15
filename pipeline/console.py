"""What a run shows on the terminal: a progress bar while it serves, a short table at the end."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from pipeline.metrics import StepRecord


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
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
