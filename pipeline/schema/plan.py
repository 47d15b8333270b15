"""Schemas of the planning and measuring commands' keys: `plan.*` and `capacity.*`
(python -m pipeline.plan), `slo.*` (goodput in every run's metrics) and `calibrate.*`
(python -m pipeline.calibrate)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from stages.forward.buckets import Bucketing


class Objective(enum.StrEnum):
    """What the plan ranks eligible configurations by without a target (`plan.objective`).
    Members are named by their values: OmegaConf matches a config value by name."""

    goodput_per_card = "goodput_per_card"  # requests/s meeting the SLO, per card: the most
    cost = "cost"  # USD per million output tokens at the device's price: the least


@dataclass
class CalibrateConf:
    """`python -m pipeline.calibrate`: which measured steps the cost model is fitted to."""

    grid_shapes: int = 0  # padding-only warmup shapes to time (a padding forward); 0 = none
    serve: bool = True  # serve the configured workload for real and fit its steps
    runs: list[str] = field(default_factory=list)  # real run folders whose steps to fit too


@dataclass
class SloConf:
    """Latency bounds a request must meet to count towards goodput (vLLM's --goodput)."""

    ttft_ms: float = 0.0  # arrival to the first token; 0 = no bound
    tpot_ms: float = 0.0  # (e2e - ttft) / (output tokens - 1); 0 = no bound
    e2e_ms: float = 0.0  # arrival to the last token; 0 = no bound
    attainment: float = 0.9  # fraction of requests that must meet every bound


@dataclass
class CapacityConf:
    """The capacity search of `python -m pipeline.plan` (pipeline/plan/capacity.py)."""

    max_probes: int = 12  # runs one search may make
    tolerance: float = 0.05  # rates: stop when the bracket's ends are within 5%
    keep_run_files: bool = False  # probes also write steps.jsonl and generations.jsonl
    decide_early: bool = True  # a probe stops once it has missed its SLO for certain
    estimate_start: bool = True  # first probe at the cost model's ceiling, not the workload's load
    # Steady state (pipeline/plan/sustained.py; conf/plan.yaml: on): a probe serves at
    # least min_requests and turnover x its in-flight count, and misses where its TTFT
    # still grows over its second half by more than growth_limit; the target check 3 x.
    sustained: bool = False
    min_requests: int = 1000
    turnover: float = 20.0
    growth_limit: float = 0.2


@dataclass
class PlanConf:
    """`python -m pipeline.plan`: how the configurations are ranked (pipeline/plan/report.py)."""

    objective: Objective = (
        Objective.goodput_per_card
    )  # without a target; or cost: per million output tokens
    # USD per card-hour by device (hardware.name), 0 = no price; conf/plan.yaml ships cited
    # on-demand prices, plan.prices.gaudi3=2.0 sets or overrides one (+plan.prices.NAME=X
    # for another profile). A device without one is not ranked by cost (the plan says so).
    prices: dict[str, float] = field(
        default_factory=lambda: {"h100": 0.0, "h200": 0.0, "gaudi2": 0.0, "gaudi3": 0.0}
    )
    # rule out longer predicted warmups: a readiness budget (an hour); 0 = none
    max_warmup_s: float = 3600.0  # bounds ready_s: weight load + capture or compile
    # the storage's read bandwidth, GB/s, the weights' load time (pipeline/plan/readiness.py);
    # conf/plan.yaml cites its default
    load_gbs: float = 1.0
    model_id: str = ""  # what the deploy commands load; "" = the model's name
    # metadata.bucketing on a device that pads to buckets (Gaudi), where not given; a GPU
    # takes cudagraph. conf/plan.yaml: exponential, whose warmups fit plan.max_warmup_s.
    hpu_bucketing: Bucketing = Bucketing.linear
    # The load the deployment must serve (pipeline/plan/target.py): requests/s (open loop;
    # a trace's own rate as workload.time_scale scales it) or requests in flight (closed
    # loop); 0 = none (configurations ranked per card, not sized).
    target_rps: float = 0.0
    target_concurrency: int = 0
