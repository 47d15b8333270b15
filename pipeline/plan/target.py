"""A plan's target load: how many replicas of one configuration serve it, and a check.

`plan.target_rps` is the request rate the deployment must serve (open loop: Poisson
arrivals, or a trace's own arrivals scaled as `workload.time_scale` scales them) and
`plan.target_concurrency` the requests in flight it must hold (closed loop). From one
replica's capacity:

    replicas = ceil(target / capacity)      cards = replicas x replica_cards
    headroom = replicas x capacity / target - 1

A replica's capacity is dp times the simulated device's (it runs one dp replica) and its
cards are pipeline/config/layout.py's (tp x dp, or the disaggregated pools').

Then the answer is checked: one replica serves target / replicas, the load a round-robin
balancer hands it, in full (no early stop), and its attainment is reported. A
configuration whose check misses the SLO gets one more replica, and is checked again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.config.layout import layout_of
from pipeline.plan.capacity import load_axis, probe_met, run_probe
from pipeline.plan.sustained import CHECK_FACTOR, SustainedRule
from pipeline.schema import schema_view

log = structlog.get_logger(__name__)

CHECKS = "checks"  # the job folder's subfolder for the checks' probes


@dataclass(frozen=True)
class Sizing:
    """Replicas of one configuration at a target; `capacity` and `target` in one unit."""

    target: float
    capacity: float  # one replica's
    replicas: int
    replica_cards: int  # cards one replica takes (pipeline/config/layout.py)

    @property
    def cards(self) -> int:
        return self.replicas * self.replica_cards

    @property
    def headroom(self) -> float:
        return self.replicas * self.capacity / self.target - 1


def sizing(target: float, capacity: float, replica_cards: int, extra: int = 0) -> Sizing:
    """ceil(target / capacity) replicas (at least one), plus `extra`."""
    if target <= 0 or capacity <= 0:
        raise ValueError(f"a target ({target}) and a capacity ({capacity}) above 0 are needed")
    ratio = target / capacity
    replicas = max(1, math.ceil(ratio - 1e-9 * ratio))  # 20 / 5 is 4, not 5 by rounding
    return Sizing(target, capacity, replicas + extra, replica_cards)


def target_of(cfg: DictConfig) -> float:
    """The plan's target in the capacity axis's unit (req/s, or concurrency); 0: none.
    ConfigError when the target does not fit the workload's loop."""
    rps = float(cfg.plan.get("target_rps") or 0.0)
    concurrency = int(cfg.plan.get("target_concurrency") or 0)
    if rps < 0 or concurrency < 0:
        raise ConfigError(f"plan.target_rps={rps}, plan.target_concurrency={concurrency}: >= 0")
    if rps and concurrency:
        raise ConfigError("give plan.target_rps (open loop) or plan.target_concurrency, not both")
    closed = bool(cfg.workload.get("concurrency"))
    if concurrency and not closed:
        raise ConfigError(
            "plan.target_concurrency sizes a closed loop: set workload.concurrency too "
            "(or give plan.target_rps for an open loop)"
        )
    if rps and closed:
        raise ConfigError(
            "plan.target_rps sizes an open loop: drop workload.concurrency "
            "(or give plan.target_concurrency)"
        )
    return float(concurrency) if concurrency else rps


def replica_capacity(result: dict[str, Any]) -> float:
    """One replica's capacity in the target's unit: the concurrency found; for a rate, the
    lower of the rate asked and the rate its probe's arrivals came at; for a trace, the
    request rate at its speed-up (the trace's own rate times the speed-up)."""
    if result["capacity_key"] == "workload.time_scale":
        return float(result["capacity_rps"])
    if result["capacity_key"] == "workload.rate" and result.get("capacity_rps"):
        # Poisson arrivals of a finite probe come at their own rate, not the one asked:
        # the replica served the lower of the two
        return min(float(result["capacity"]), float(result["capacity_rps"]))
    return float(result["capacity"])


def check_load(result: dict[str, Any], share: float) -> float:
    """The capacity axis's load that offers one replica `share` (its part of the target):
    for a trace the speed-up, proportional to the request rate; concurrency rounded up."""
    key = result["capacity_key"]
    if key == "workload.time_scale":
        return float(result["capacity"]) * share / float(result["capacity_rps"])
    if key == "workload.concurrency":
        return float(math.ceil(share - 1e-9))
    return share


def check_target(cfg: DictConfig, out_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Sizes the configuration for the plan's target and checks one replica at its share;
    the result gains `target` (the sizing and each check). Nothing to size when the search
    found no capacity."""
    target = target_of(cfg)
    if not target or not result.get("capacity_found"):
        return result
    axis = load_axis(cfg)
    trace = axis.key == "workload.time_scale"  # served whole, as in the search
    sustained = SustainedRule.of(schema_view(cfg).capacity)
    checks: list[dict[str, Any]] = []
    layout = layout_of(cfg)
    capacity = replica_capacity(result) * layout.capacity_scale
    size = sizing(target, capacity, layout.cards)
    for extra in (0, 1):
        size = sizing(target, capacity, layout.cards, extra)
        # the simulated device is one dp replica: its share is the replica's over dp
        load = check_load(result, target / size.replicas / layout.capacity_scale)
        probe = cfg.copy()
        OmegaConf.update(probe, axis.key, axis.value(load))
        if sustained and "num_requests" in probe.workload and not trace:
            probe.workload.num_requests = CHECK_FACTOR * int(result["num_requests"])
        folder = out_dir / CHECKS / f"{size.replicas}-replicas"
        metrics = run_probe(probe, folder, keep_files=False, decide_early=False)
        met = probe_met(metrics)
        checks.append({"replicas": size.replicas, "load": load, "met": met,
                       "attainment": metrics.get("slo_attainment"),
                       "requests": metrics.get("num_requests"),
                       "folder": str(folder.relative_to(out_dir))})  # fmt: skip
        log.info("target_check", replicas=size.replicas, load=load, met=met)
        if met:
            break
    result["target"] = {
        **asdict(size),
        "key": axis.key,
        "unit": "concurrency" if axis.integer else "req/s",
        "cards": size.cards,
        "headroom": size.headroom,
        "check_attainment": checks[-1]["attainment"],
        "check_met": checks[-1]["met"],
        "replica_added": len(checks) > 1,
        "checks": checks,
    }
    return result
