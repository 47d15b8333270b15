"""A plan's configurations at their capacity, the rules that rule some out, and the ranking.

Per replica: one copy of a configuration, `replica_cards` cards (tp x dp; with
disaggregation prefill x prefill_tp + decode x decode_tp: pipeline/layout.py). Its capacity
(requests/s, or a concurrency) is what one replica serves within the SLO: dp times what the
simulated device (one dp replica) served. Per card: a replica's figure over its cards;
goodput per card = capacity (req/s) x attainment / replica_cards. At a target load
(pipeline/plan/target.py) a configuration takes `replicas` copies, `cards` = replicas x
replica_cards in all, and costs cards x the device's price an hour (`plan.prices`).

Every predicted figure carries a band: +- the device profile's own held-out calibration
error (`hardware.errors`, pipeline/plan/bands.py). Configurations whose ranking figure lies
within each other's band, or within the capacity search's tolerance, are tied; a tie goes
to fewer cards, then the shorter warmup, then the smaller KV pool.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from pipeline.artefacts import RESOLVED_CONFIG
from pipeline.layout import Layout, layout_of
from pipeline.plan.bands import Band, profile_band
from pipeline.plan.target import sizing
from pipeline.run_folder import RunStatus
from pipeline.summary import Job


class Objective(enum.StrEnum):
    """What the plan ranks eligible configurations by without a target (`plan.objective`)."""

    GOODPUT_PER_CARD = "goodput_per_card"  # requests/s meeting the SLO, per card: the most
    COST = "cost"  # USD per million output tokens at the device's price: the least


@dataclass
class Candidate:
    """One configuration of the plan at its capacity."""

    job: Job
    config: dict[str, Any]
    ruled_out: str = ""  # why it cannot be chosen ("" = it can)

    def metric(self, *keys: str) -> float | None:
        node: Any = self.job.metrics
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return (
            float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None
        )

    @property
    def device(self) -> str:
        hardware = self.config.get("hardware")
        return str(hardware.get("name")) if isinstance(hardware, dict) else "-"

    @property
    def band(self) -> Band:
        return profile_band(self.config.get("hardware"))

    @property
    def layout(self) -> Layout:
        return layout_of(self.config)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def replica_cards(self) -> int:
        """Cards per replica (pipeline/layout.py)."""
        return self.layout.cards

    @property
    def target(self) -> dict[str, Any] | None:
        target = self.job.metrics.get("target")
        return target if isinstance(target, dict) else None

    @property
    def replicas(self) -> int:
        return int(self.target["replicas"]) if self.target else 1

    @property
    def cards(self) -> int:
        """Cards in all: replicas x replica_cards at the target; one replica's without one."""
        return self.replicas * self.replica_cards

    @property
    def capacity(self) -> float | None:
        """One replica's capacity in the search's unit (dp simulated replicas' worth)."""
        found = self.metric("capacity")
        return None if found is None else found * self.layout.capacity_scale

    @property
    def capacity_rps(self) -> float:
        """Requests/s one replica serves at capacity (dp simulated replicas' worth)."""
        return (self.metric("capacity_rps") or 0.0) * self.layout.capacity_scale

    @property
    def attainment(self) -> float:
        return self.metric("slo_attainment") or 0.0

    @property
    def goodput_per_card(self) -> float:
        """capacity (req/s) x attainment / replica_cards."""
        return self.capacity_rps * self.attainment / self.replica_cards

    @property
    def output_throughput(self) -> float:
        """Output tokens/s of one replica at capacity."""
        return (self.metric("output_throughput") or 0.0) * self.layout.capacity_scale

    @property
    def tokens_per_card(self) -> float:
        return self.output_throughput / self.replica_cards

    @property
    def tokens_per_user(self) -> float | None:
        tpot = self.metric("tpot_ms", "mean")
        return 1000.0 / tpot if tpot else None

    @property
    def warmup_s(self) -> float:
        return self.metric("predicted_warmup_s") or 0.0

    @property
    def compiles(self) -> int:
        return int(self.metric("serving_compiles") or 0)

    def price(self, prices: Mapping[str, float]) -> float | None:
        value = prices.get(self.device)
        return float(value) if value else None

    def usd_per_hour(self, prices: Mapping[str, float]) -> float | None:
        """All cards at the target (one replica's without one), an hour."""
        price = self.price(prices)
        return None if price is None else self.cards * price

    def usd_per_hour_range(self, prices: Mapping[str, float]) -> tuple[float, float] | None:
        """$/hour if the capacity were at either end of its band: replicas re-rounded."""
        price, target = self.price(prices), self.target
        if price is None or not target:
            return None
        ends = []
        for capacity in self.band.ends(float(target["capacity"])):
            size = sizing(float(target["target"]), capacity, self.replica_cards)
            ends.append(size.cards * price)
        return min(ends), max(ends)

    def cost_per_mtok(self, prices: Mapping[str, float]) -> float | None:
        tokens, price = self.output_throughput, self.price(prices)
        if not price or not tokens:
            return None
        return price * self.replica_cards / (tokens * 3600) * 1e6


def read_candidates(jobs: Sequence[Job], max_warmup_s: float) -> list[Candidate]:
    """Every job, with the reason it is ruled out, if any: its ep / dp cannot be deployed,
    it failed, no load met the SLO,
    its predicted warmup outlasts plan.max_warmup_s, or its target check missed twice."""
    out = []
    for job in jobs:
        resolved = job.path / RESOLVED_CONFIG
        config = yaml.safe_load(resolved.read_text(encoding="utf-8")) if resolved.is_file() else {}
        c = Candidate(job, config or {})
        target = c.target
        if job.metrics.get("ruled_out"):  # before any search (pipeline/plan/__init__.py)
            c.ruled_out = str(job.metrics["ruled_out"])
        elif job.status != RunStatus.OK:
            c.ruled_out = f"{job.status}: {job.error}"
        elif not job.metrics.get("capacity_found"):
            c.ruled_out = str(job.metrics.get("capacity_reason") or "no load met the SLO")
        elif max_warmup_s and c.warmup_s > max_warmup_s:
            c.ruled_out = f"warmup {c.warmup_s:,.0f} s > plan.max_warmup_s={max_warmup_s:g}"
        elif target and not target.get("check_met"):
            c.ruled_out = (
                f"one replica of {target['replicas']} missed the SLO at its share of the target"
            )
        out.append(c)
    return out


@dataclass(frozen=True)
class Ranking:
    """The plan's order, what it ranks by, and the tie at its top."""

    order: list[Candidate]  # eligible, best first
    by: str  # what the order is by
    tied: list[Candidate]  # the best and those tied with it (one: no tie)
    note: str  # how the order was made: a missing price, a tie broken


def rank(
    cands: Sequence[Candidate],
    objective: Objective | str,
    prices: Mapping[str, float],
    tolerance: float = 0.0,
) -> Ranking:
    """At a target: by $/hour where every eligible device has a price, else by goodput per
    card (and the note names the missing prices). Without one: by `objective`."""
    eligible = [c for c in cands if not c.ruled_out]
    missing = sorted({c.device for c in eligible if c.price(prices) is None})
    sized = any(c.target for c in eligible)
    note = ""
    if missing and (sized or objective == Objective.COST):
        note = (
            f"no price for {', '.join(missing)} (give plan.prices.{missing[0]}=USD per card-hour): "
            "ranked by goodput per card, not by cost. "
        )
    if sized and not missing:
        by = "usd_per_hour"
    elif objective == Objective.COST and not missing:
        by = "cost_per_mtok_usd"
    else:
        by = "goodput_per_card"
    order = sorted(eligible, key=lambda c: _sort_key(c, by, prices))
    tied = _tied(order, by, prices, tolerance)
    if len(tied) > 1:
        chosen = min(tied, key=_tie_key)
        order.remove(chosen)
        order.insert(0, chosen)
        jobs = ", ".join(str(c.job.num) for c in tied)
        note += (
            f"jobs {jobs} are tied on {by} (within each other's band or the search tolerance); "
            "a tie goes to fewer cards, then shorter warmup, then fewer KV blocks: "
            f"job {chosen.job.num} chosen ({_decided_by(chosen, tied)})."
        )
    return Ranking(order, by, tied, note.strip())


def _tie_key(c: Candidate) -> tuple[float, float, float]:
    return (c.cards, c.warmup_s, c.metric("num_blocks") or 0)


def _decided_by(chosen: Candidate, tied: Sequence[Candidate]) -> str:
    """Which of the tie's criteria put `chosen` first, against the runner-up."""
    others = sorted((c for c in tied if c is not chosen), key=_tie_key)
    if not others:
        return "alone"
    other = others[0]
    names = ("cards", "warmup s", "KV blocks")
    for name, mine, theirs in zip(names, _tie_key(chosen), _tie_key(other), strict=True):
        if mine != theirs:
            return f"{name} {mine:,.0f} against job {other.job.num}'s {theirs:,.0f}"
    return f"equal to job {other.job.num} on all three: the first ranked kept"


def _sort_key(c: Candidate, by: str, prices: Mapping[str, float]) -> tuple[float, ...]:
    if by == "usd_per_hour":
        return (c.usd_per_hour(prices) or math.inf, c.cards, c.warmup_s)
    if by == "cost_per_mtok_usd":
        return (c.cost_per_mtok(prices) or math.inf, c.warmup_s)
    return (-c.goodput_per_card, c.warmup_s)


def _interval(c: Candidate, by: str, prices: Mapping[str, float]) -> tuple[float, float]:
    if by == "usd_per_hour":
        return c.usd_per_hour_range(prices) or (math.inf, math.inf)
    value = c.cost_per_mtok(prices) if by == "cost_per_mtok_usd" else c.goodput_per_card
    if value is None:
        return (math.inf, math.inf)
    low, high = c.band.ends(value)
    return (min(low, high), max(low, high))


def _tied(
    order: list[Candidate], by: str, prices: Mapping[str, float], tolerance: float
) -> list[Candidate]:
    """The first of `order` and every other whose interval overlaps its own, or whose
    value is within the search tolerance of it."""
    if not order:
        return []
    first = order[0]
    low, high = _interval(first, by, prices)
    best = _sort_key(first, by, prices)[0]
    tied = [first]
    for c in order[1:]:
        lo, hi = _interval(c, by, prices)
        value = _sort_key(c, by, prices)[0]
        close = math.isfinite(best) and abs(value - best) <= tolerance * abs(best)
        if close or (lo <= high and low <= hi and math.isfinite(hi)):
            tied.append(c)
    return tied


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Eligible candidates no other beats on both tokens/s per card and per user."""
    points = [c for c in cands if not c.ruled_out and c.tokens_per_user is not None]

    def dominated(c: Candidate) -> bool:
        return any(
            o.tokens_per_card >= c.tokens_per_card
            and o.tokens_per_user >= c.tokens_per_user
            and (o.tokens_per_card, o.tokens_per_user) != (c.tokens_per_card, c.tokens_per_user)
            for o in points
        )

    return sorted((c for c in points if not dominated(c)), key=lambda c: c.tokens_per_user or 0)


def best_per_device(order: Sequence[Candidate]) -> dict[str, Candidate]:
    """The first of the ranked order on each device."""
    found: dict[str, Candidate] = {}
    for c in order:
        found.setdefault(c.device, c)
    return found
