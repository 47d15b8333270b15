"""Capacity search: the highest load one configuration serves within its SLO.

The load is the open loop's request rate (`workload.rate`; for a trace with timestamps, a
speed-up of its own arrivals through `workload.time_scale`) or the closed loop's
concurrency (`workload.concurrency`, when one is given). A probe serves the workload at one
load on the simulated device; it meets the SLO when `slo_attainment >= slo.attainment`.
The search brackets (doubling or halving from the starting load until one probe meets the
SLO and one does not), then bisects (geometric midpoints for rates, integers for
concurrency) until the bracket is within `capacity.tolerance`, as Vidur's capacity search
does for its scheduling-delay SLO.

Every probe keeps its folder under `probes/` with its resolved config and metrics.json;
per-step and per-token files only with `capacity.keep_run_files=true`. A probe stops as
soon as more requests have missed the SLO than the target allows: its verdict cannot
change after that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.disagg.config import disaggregated
from pipeline.disagg.deployment import search_stand_in, serve_deployment
from pipeline.executors import build_engine, check_config
from pipeline.executors.simulated import simulated_device
from pipeline.job.engine import Engine
from pipeline.job.metrics import StepTotals
from pipeline.job.run import device_metrics, run_metrics, run_requests, slo_of, unfinished
from pipeline.job.serving import Ending, serve_and_summarise
from pipeline.job.slo import EarlyVerdict, Slo, needed_good
from pipeline.plan.capacity_estimate import rate_ceiling
from pipeline.plan.capacity_report import write_reports
from pipeline.plan.probes import LoadAxis, Probe
from pipeline.plan.sustained import SustainedRule, in_flight, ttft_growth
from pipeline.run_folder import artefacts
from pipeline.run_folder.reader import RunStatus
from stages.scheduling.request import FinishReason, Request

log = structlog.get_logger(__name__)

STOPPED = "stopped: the probe had already missed its SLO"


def load_axis(cfg: DictConfig) -> LoadAxis:
    """The closed loop's concurrency when one is set, else a trace's speed-up, else the
    Poisson rate; starting at the workload's own value."""
    workload = cfg.workload
    if workload.get("concurrency"):
        return LoadAxis("workload.concurrency", workload.concurrency, True, "concurrency")
    if "time_scale" in workload and not workload.get("rate"):
        return LoadAxis("workload.time_scale", 1.0, False, "x trace rate", workload.time_scale)
    if "rate" in workload:
        return LoadAxis("workload.rate", workload.rate or 1.0, False, "req/s")
    raise ConfigError(
        "the capacity search scales workload.rate, a trace's workload.time_scale or "
        "workload.concurrency: this workload has none (use workload=synthetic, jsonl or trace)"
    )


def offered_rps(requests: Sequence[Request]) -> float | None:
    """The open loop's request rate: requests after the first over the arrivals' span."""
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return (len(arrivals) - 1) / span if span > 0 else None


def run_probe(
    cfg: DictConfig, folder: Path, keep_files: bool, decide_early: bool = True
) -> dict[str, Any]:
    """Serves one probe into `folder`; returns its metrics (also written there). With
    decide_early, the probe stops once it has missed its SLO for certain (its metrics then
    say so under `decided_early`)."""
    with artefacts.writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    artefacts.write_resolved_config(cfg, folder)
    if disaggregated(cfg):  # both pools served through: no early verdict, no step files
        deployment, metrics = serve_deployment(cfg, slo_of(cfg), folder, generations=False)
        requests, arrivals = deployment.requests, offered_rps(deployment.requests)
    else:
        engine, requests = build_engine(cfg)
        arrivals = offered_rps(requests)
        if keep_files:
            metrics = run_requests(cfg, engine, requests, folder)
        else:
            metrics = serve_judged(cfg, engine, requests, folder, decide_early)
    if not cfg.workload.get("concurrency"):
        metrics["offered_rps"] = arrivals
    rule = SustainedRule.of(cfg.capacity)
    growth = ttft_growth(requests, float(cfg.slo.ttft_ms), rule.growth_limit) if rule else None
    if growth:  # a queue still growing: no steady state at this load
        metrics["ttft_growth"] = growth.as_metrics()
    refused = [
        r.error for r in requests if r.finish_reason == FinishReason.ERROR and r.error != STOPPED
    ]

    metrics["refused_requests"] = len(refused)  # at any load: the limits cannot serve them
    if refused:
        metrics["refused_example"] = refused[0]
    artefacts.write_metrics(metrics, folder)  # the probe's folder holds what judged it
    return metrics


def probe_met(metrics: dict[str, Any]) -> bool:
    """The probe served through, met its SLO and, judged for steady state, held it."""
    growth = metrics.get("ttft_growth") or {}
    return (
        bool(metrics.get("slo_met"))
        and metrics["status"] == RunStatus.OK
        and not growth.get("grew")
    )


def serve_judged(
    cfg: DictConfig, engine: Engine, requests: list[Request], folder: Path, decide_early: bool
) -> dict[str, Any]:
    """The probe's run, metrics only (written into `folder`); ended by its SLO verdict once
    that is certain."""
    totals = StepTotals()
    verdict = EarlyVerdict(slo_of(cfg), requests, arrivals_fixed=not engine.concurrency)

    def serve_all() -> float:
        return engine.run(
            requests, on_step=totals.add, on_finish=verdict.on_finish, on_run=totals.add_run,
            stop=verdict if decide_early else None,
        )  # fmt: skip

    def decided() -> Ending | None:
        return Ending(RunStatus.STOPPED, STOPPED) if verdict.decided_at is not None else None

    def summarise(duration: float, warmup_s: float, status: RunStatus) -> dict[str, Any]:
        metrics = run_metrics(cfg, engine, requests, totals, duration, warmup_s, status)
        if verdict.decided_at is not None:
            metrics["decided_early"] = verdict.describe()
        return metrics

    served = serve_and_summarise(
        cfg, engine, serve_all, lambda: unfinished(requests), summarise, folder, ended_early=decided
    )
    return served.metrics


class Search:
    """The probes of one capacity search, each at most once per load."""

    def __init__(
        self, cfg: DictConfig, out_dir: Path, axis: LoadAxis, first_step: float = 2.0
    ) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.axis = axis
        self.first_step = first_step  # the bracket's first step up or down, a factor
        self.settings = cfg.capacity
        self.probes: dict[float, Probe] = {}
        self.metrics: dict[float, dict[str, Any]] = {}

    def met(self, load: float) -> bool:
        if load not in self.probes:
            self.probes[load] = self._probe(load)
        return self.probes[load].met

    def _probe(self, load: float) -> Probe:
        value = self.axis.value(load)
        folder = self.out_dir / "probes" / f"{len(self.probes):02d}-{self.axis.key}={value:.6g}"
        cfg = self.cfg.copy()
        OmegaConf.update(cfg, self.axis.key, value)
        rule = SustainedRule.of(self.settings)
        sized = rule is not None and "num_requests" in cfg.workload and not self.is_trace
        if sized:
            assert rule is not None
            own = int(self.cfg.workload.num_requests)
            cfg.workload.num_requests = rule.requests(own, self._in_flight_at(load))
        settings = (self.settings.keep_run_files, self.settings.decide_early)
        metrics = run_probe(cfg, folder, *settings)
        if sized and probe_met(metrics):  # long enough for the in-flight count it measured?
            assert rule is not None
            needed = rule.requests(int(cfg.workload.num_requests), self._in_flight(metrics, load))
            if needed > cfg.workload.num_requests:
                cfg.workload.num_requests = needed
                folder = folder.with_name(folder.name + "-longer")
                metrics = run_probe(cfg, folder, *settings)
        self.metrics[load] = metrics
        probe = Probe(
            load=load,
            met=probe_met(metrics),
            attainment=metrics.get("slo_attainment"),
            goodput=metrics.get("request_goodput", 0.0),
            offered_rps=metrics.get("offered_rps"),
            status=metrics["status"],
            folder=str(folder.relative_to(self.out_dir)),
            refused=metrics["refused_requests"],
        )
        log.info("capacity_probe", **{self.axis.key: value}, met=probe.met, status=probe.status)
        return probe

    @property
    def is_trace(self) -> bool:
        return self.axis.key == "workload.time_scale"  # served whole: its own duration

    def _in_flight(self, metrics: dict[str, Any], load: float) -> float:
        return in_flight(metrics, int(load) if self.axis.integer else 0)

    def _in_flight_at(self, load: float) -> float:
        """In flight at `load`, from the nearest probe so far (its latency assumed)."""
        if self.axis.integer:
            return load
        if not self.metrics:
            return 0.0
        near = min(self.metrics, key=lambda seen: abs(math.log(seen / load)))
        return self._in_flight(self.metrics[near], near) * load / near

    @property
    def budget_left(self) -> bool:
        return len(self.probes) < self.settings.max_probes

    @property
    def hopeless(self) -> bool:
        """More requests refused (too long for the limits, ...) than the SLO's target
        allows: no load, however low, can meet it."""
        probe = next(iter(self.probes.values()), None)
        if probe is None:
            return False
        num_requests = self.metrics[probe.load]["num_requests"]
        return probe.refused > num_requests - needed_good(num_requests, self.cfg.slo.attainment)


def bracket(search: Search) -> tuple[float | None, float | None]:
    """(a load that meets the SLO, a higher one that does not); None where the probe budget
    (or, going down, a concurrency of 1) ran out first. Steps from the start by
    search.first_step, each step the square of the last, at most doubling: from an estimate
    a close bracket first (a bisection or two from tight), from the workload's own load
    doubling."""
    axis, step = search.axis, search.first_step
    lo, hi = (axis.start, None) if search.met(axis.start) else (None, axis.start)
    while lo is None and search.budget_left and not search.hopeless:
        assert hi is not None
        load = min(math.floor(hi / step), hi - 1) if axis.integer else hi / step
        if load < (1 if axis.integer else 1e-6):
            break
        step = min(2.0, step * step)
        lo, hi = (load, hi) if search.met(load) else (None, load)
    while hi is None and search.budget_left:
        assert lo is not None
        load = max(math.ceil(lo * step), lo + 1) if axis.integer else lo * step
        step = min(2.0, step * step)
        lo, hi = (lo, load) if not search.met(load) else (load, None)
    return lo, hi


def narrow(search: Search, lo: float, hi: float) -> tuple[float, float]:
    """Bisects the bracket until it is tight: adjacent concurrencies, or hi / lo within
    1 + capacity.tolerance."""
    tolerance = search.settings.tolerance
    integer = search.axis.integer

    def tight() -> bool:
        return hi - lo <= 1 if integer else hi <= lo * (1 + tolerance)

    while not tight() and search.budget_left:
        mid = (lo + hi) // 2 if integer else math.sqrt(lo * hi)
        lo, hi = (mid, hi) if search.met(mid) else (lo, mid)
    return lo, hi


def capacity_search(
    cfg: DictConfig, out_dir: Path, max_warmup_s: float = 0.0, start_up_s: float = 0.0
) -> dict[str, Any]:
    """Finds the configuration's capacity; writes capacity.json, capacity.md and, as the
    folder's metrics.json, the metrics at capacity with the search's result beside them.
    max_warmup_s: a configuration whose start-up (start_up_s, e.g. its weights' load, plus
    its predicted warmup) is longer is not searched (a plan rules it out whatever its
    capacity; 0 = search every one)."""
    slo = slo_of(cfg)
    if not slo.bounds:
        raise ConfigError(
            "a capacity search needs an SLO: give slo.ttft_ms, slo.tpot_ms or slo.e2e_ms"
        )
    if not check_config(cfg).predicts:
        raise ConfigError("the capacity search runs on the simulated device: executor=simulated")
    check_settings(cfg.capacity)
    artefacts.write_resolved_config(cfg, out_dir)
    # As given (a deployment: one decode instance, its load shared by `share`): its
    # predicted warmup, where to start.
    stand_in, share = search_stand_in(cfg)
    engine, requests = build_engine(stand_in)
    device = device_metrics(engine)
    axis, first_step = load_axis(cfg), 2.0
    estimate = (
        estimated_start(cfg, axis, engine, requests, slo) if cfg.capacity.estimate_start else None
    )
    estimate = estimate * share if estimate is not None else None
    if estimate is not None:  # near capacity: a step that one or two bisections make tight
        axis, first_step = replace(axis, start=estimate), (1 + cfg.capacity.tolerance) ** 2
    search = Search(cfg, out_dir, axis, first_step)
    warmup_s = device.get("predicted_warmup_s")
    ready_s = None if warmup_s is None else start_up_s + warmup_s
    if max_warmup_s and ready_s is not None and ready_s > max_warmup_s:
        reason = (
            f"ready {ready_s:,.0f} s (warmup {warmup_s:,.0f} s) > plan.max_warmup_s="
            f"{max_warmup_s:g}: not searched"
        )
        result = not_searched(search, reason, {**device, "num_requests": len(requests)})
        result["num_blocks"] = engine.scheduler.kv_cache.num_blocks
    else:
        lo, hi = bracket(search)
        if lo is not None and hi is not None:
            lo, hi = narrow(search, lo, hi)
        result = search_result(search, lo, hi)
    slo_text = f"SLO {Slo.of(cfg.slo).describe()}, attainment >= {cfg.slo.attainment}"
    write_reports(search.axis, list(search.probes.values()), slo_text, result, out_dir)
    return result


def estimated_start(
    cfg: DictConfig, axis: LoadAxis, engine: Engine, requests: Sequence[Request], slo: Slo
) -> float | None:
    """The first load to probe: the cost model's steady-state ceiling in the axis's unit
    (pipeline/plan/capacity_estimate.py). Starting near capacity spares the search its costliest
    probes, those far below it (many small steps each), whichever side it lands on."""
    ceiling = rate_ceiling(
        simulated_device(engine).cost, requests, cfg.block_size, cfg.max_num_seqs,
        engine.scheduler.kv_cache.num_blocks, slo.tpot_ms,
    )  # fmt: skip
    if ceiling is None:
        return None
    if axis.integer:
        return float(max(1, ceiling.batch))
    if axis.key == "workload.time_scale":  # a multiple of the trace's own rate
        own = offered_rps(requests)
        return ceiling.rate / own if own else None
    return ceiling.rate


def not_searched(search: Search, reason: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The result of a search not made (nothing served): the reason and what is known."""
    axis = search.axis
    return {
        "status": RunStatus.OK,
        **metrics,
        "max_model_len": search.cfg.max_model_len,
        "capacity_found": False,
        "capacity_key": axis.key,
        "capacity_unit": axis.unit,
        "capacity": 0,
        "capacity_value": None,
        "capacity_above": None,
        "capacity_rps": 0.0,
        "capacity_probes": 0,
        "capacity_reason": reason,
    }


def check_settings(settings: DictConfig) -> None:
    if settings.max_probes < 2 or not 0 < settings.tolerance < 1:
        raise ConfigError(
            f"capacity.max_probes={settings.max_probes} and capacity.tolerance="
            f"{settings.tolerance}: give at least 2 probes and a tolerance in (0, 1), e.g. 0.05"
        )


def search_result(search: Search, lo: float | None, hi: float | None) -> dict[str, Any]:
    """metrics.json of the search: the metrics of the probe at capacity (or, when no load
    met the SLO, of the lowest probe) and the `capacity_*` keys."""
    axis = search.axis
    shown = lo if lo is not None else min(search.probes)
    metrics = dict(search.metrics[shown])
    rps = metrics.get("offered_rps")
    if axis.integer or rps is None:  # closed loop: the request rate it achieved
        duration = metrics.get("duration_s") or 0.0
        rps = metrics["num_requests"] / duration if duration else None
    metrics.update(
        status=RunStatus.OK,
        capacity_found=lo is not None,
        capacity_key=axis.key,
        capacity_unit=axis.unit,
        capacity=lo if lo is not None else 0,
        capacity_value=axis.value(lo) if lo is not None else None,
        capacity_above=hi,  # the next load probed above it, which missed (None: not found)
        capacity_rps=rps if lo is not None else 0.0,
        capacity_probes=len(search.probes),
    )
    if lo is None:
        metrics["capacity_reason"] = not_found_reason(search, metrics)
    return metrics


def not_found_reason(search: Search, metrics: dict[str, Any]) -> str:
    if search.hopeless:
        return (
            f"{metrics['refused_requests']} of {metrics['num_requests']} requests refused at "
            f"any load ({metrics.get('refused_example')})"
        )
    lowest = min(search.probes)
    return f"no probed load met the SLO (lowest {lowest:.4g} {search.axis.unit})"
