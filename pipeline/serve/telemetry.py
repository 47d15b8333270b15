"""/metrics: Prometheus series named as vLLM's where there is a counterpart, plus this
engine's own (`hpu_pipeline:`).

Latency histograms and token counters are observed as each request ends; the gauges
(running and waiting requests, KV-cache usage) and the engine's own counters are read from
the engine when Prometheus scrapes, so they cost the step loop nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.job.engine import Engine
from pipeline.job.metrics import e2e_s, itl_s, ttft_s
from pipeline.run_folder.records import StepRecord
from stages.scheduling.request import FinishReason, Request

# Bucket edges in seconds, as wide as vLLM's (first token of a long prompt to minutes).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0)  # fmt: skip


class Telemetry:
    """The server's metrics registry; observe_* are called from the engine's thread."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and the like
        labels = ["model_name"]
        reg = self.registry
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first output token.",
            labels, buckets=TTFT_BUCKETS, registry=reg,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Gap between consecutive output tokens.",
            labels, buckets=ITL_BUCKETS, registry=reg,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to the request's end.",
            labels, buckets=E2E_BUCKETS, registry=reg,
        )  # fmt: skip
        self.success = Counter(
            "vllm:request_success", "Requests ended, by finish reason.",
            ["model_name", "finished_reason"], registry=reg,
        )  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens.", labels, registry=reg)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Output tokens.", labels, registry=reg
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
            labels, registry=reg,
        )  # fmt: skip
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
            labels, registry=reg,
        )  # fmt: skip
        self.preemptions = Counter(
            "vllm:num_preemptions", "Requests preempted (recomputed later).", labels, registry=reg
        )
        self.model_name = model_name
        self.preemptions.labels(model_name)  # listed at 0 from the start, not at the first
        self.real_tokens = 0  # steps' real and padded tokens, for the padding ratio
        self.padded_tokens = 0

    def watch(self, engine: Engine) -> None:
        """Reads the engine's gauges and own counters at each scrape from now on."""
        self.registry.register(EngineCollector(engine, self))

    def observe_step(self, record: StepRecord) -> None:
        self.real_tokens += record.num_tokens
        self.padded_tokens += record.padded_tokens
        if record.preempted:
            self.preemptions.labels(self.model_name).inc(len(record.preempted))

    def observe_finish(self, request: Request) -> None:
        name = self.model_name
        reason = request.finish_reason or FinishReason.ERROR
        self.success.labels(name, "abort" if request.error else reason).inc()
        self.prompt_tokens.labels(name).inc(request.num_prompt_tokens)
        self.generation_tokens.labels(name).inc(len(request.output_ids))
        self.prefix_queries.labels(name).inc(request.num_prompt_tokens)
        self.prefix_hits.labels(name).inc(request.cached_tokens)
        ttft, e2e = ttft_s(request), e2e_s(request)
        if ttft is not None:
            self.ttft.labels(name).observe(ttft)
        if e2e is not None and not request.error:
            self.e2e.labels(name).observe(e2e)
        itl = self.itl.labels(name)
        for gap in itl_s(request):
            itl.observe(gap)


class EngineCollector(Collector):
    """What the engine knows at scrape time (read without a lock: each value is one read)."""

    def __init__(self, engine: Engine, telemetry: Telemetry) -> None:
        self.engine = engine
        self.telemetry = telemetry

    def collect(self) -> Iterator[Metric]:
        engine, name = self.engine, self.telemetry.model_name
        scheduler, kv = engine.scheduler, engine.scheduler.kv_cache
        free = kv.num_free_blocks
        gauges = {
            "vllm:num_requests_running": ("Requests in the batch.", len(scheduler.running)),
            "vllm:num_requests_waiting": ("Requests not yet admitted.", len(scheduler.waiting)),
            "vllm:kv_cache_usage_perc": ("KV blocks in use (1 = full).", 1 - free / kv.num_blocks),
            "hpu_pipeline:kv_blocks_free": ("KV blocks free or cached, unheld.", free),
            "hpu_pipeline:kv_blocks_total": ("KV blocks in the pool.", kv.num_blocks),
            "hpu_pipeline:padding_ratio": ("Padded over real tokens of the steps so far.",
                                           self._padding()),
        }  # fmt: skip
        for metric, (text, value) in gauges.items():
            family = GaugeMetricFamily(metric, text, labels=["model_name"])
            family.add_metric([name], value)
            yield family
        counters = {
            "hpu_pipeline:bucket_misses": (
                "Steps that fit no prepared bucket shape.",
                engine.metadata.bucket_misses,
            ),
        }
        if engine.simulation is not None:
            counters["hpu_pipeline:serving_compiles"] = (
                "Graphs compiled while serving (predicted).",
                engine.simulation.serving_compiles,
            )
        for metric, (text, value) in counters.items():
            counter = CounterMetricFamily(metric, text, labels=["model_name"])
            counter.add_metric([name], value)
            yield counter

    def _padding(self) -> float:
        real, padded = self.telemetry.real_tokens, self.telemetry.padded_tokens
        return padded / real if real else 1.0
