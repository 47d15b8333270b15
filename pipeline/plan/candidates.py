"""A plan's configurations at their capacity, the rules that rule some out, and the ranking.

Per replica: one copy of a configuration, `replica_cards` cards (tp x dp; with
disaggregation prefill x prefill_tp + decode x decode_tp: pipeline/config/layout.py). Its capacity
(requests/s, or a concurrency) is what one replica serves within the SLO: dp times what the
simulated device (one dp replica) served. Per card: a replica's figure over its cards;
goodput per card = capacity (req/s) x attainment / replica_cards. At a target load
(pipeline/plan/target.py) a configuration takes `replicas` copies, `cards` = replicas x
replica_cards in all, and costs cards x the device's price an hour (`plan.prices`).

Every predicted figure carries a band: +- the device profile's own held-out calibration
error (`hardware.errors`, pipeline/plan/bands.py). The order is by the central ranking
figure alone: a row whose band (or the search's tolerance) overlaps the first's is marked
tied and stays where it is; equal central figures go to more headroom, more KV memory,
then shorter readiness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from pipeline.config.layout import Layout, layout_of
from pipeline.plan.acceptance import acceptance_assumed
from pipeline.plan.bands import Band, config_band
from pipeline.plan.target import sizing
from pipeline.run_folder.artefacts import RESOLVED_CONFIG
from pipeline.run_folder.reader import RunStatus
from pipeline.schema.plan import Objective
from pipeline.summary import Job


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
        """Its figures' band: the device's and each feature's checked error (bands.py)."""
        return config_band(self.config)

    @property
    def layout(self) -> Layout:
        return layout_of(self.config)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def replica_cards(self) -> int:
        """Cards per replica (pipeline/config/layout.py)."""
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
    def ready_s(self) -> float:
        """Seconds from start to serving: weight load and graph capture or compile
        (pipeline/plan/readiness.py); the predicted warmup where a job has no readiness."""
        ready = self.metric("ready_s")
        return self.warmup_s if ready is None else ready

    @property
    def kv_tokens(self) -> float:
        """Tokens of KV cache one replica holds (its dp replicas' pools together)."""
        blocks = self.metric("num_blocks") or 0.0
        return blocks * int(self.config.get("block_size") or 1) * self.layout.capacity_scale

    @property
    def acceptance_assumed(self) -> bool:
        """A speculative row whose acceptance no measurement gave (pipeline/plan/acceptance.py)."""
        return acceptance_assumed(self.config)

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

    def cards_range(self) -> tuple[int, int] | None:
        """Cards at the target if the capacity were at either end of its band: replicas
        re-rounded (None without a target)."""
        target = self.target
        if not target:
            return None
        ends = [
            sizing(float(target["target"]), capacity, self.replica_cards).cards
            for capacity in self.band.ends(float(target["capacity"]))
            if capacity > 0
        ]
        if len(ends) < 2:  # a band of 100% or more: no lower end to the capacity
            return None
        return min(ends), max(ends)

    def usd_per_hour_range(self, prices: Mapping[str, float]) -> tuple[float, float] | None:
        """$/hour if the capacity were at either end of its band: replicas re-rounded."""
        price, cards = self.price(prices), self.cards_range()
        if price is None or cards is None:
            return None
        return cards[0] * price, cards[1] * price

    def cost_per_mtok(self, prices: Mapping[str, float]) -> float | None:
        tokens, price = self.output_throughput, self.price(prices)
        if not price or not tokens:
            return None
        return price * self.replica_cards / (tokens * 3600) * 1e6


def read_candidates(jobs: Sequence[Job], max_warmup_s: float) -> list[Candidate]:
    """Every job, with the reason it is ruled out, if any: its ep / dp cannot be deployed,
    it failed, no load met the SLO,
    its ready_s outlasts plan.max_warmup_s, or its target check missed twice."""
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
        elif max_warmup_s and c.ready_s > max_warmup_s:
            c.ruled_out = f"ready {c.ready_s:,.0f} s > plan.max_warmup_s={max_warmup_s:g}"
        elif target and not target.get("check_met"):
            c.ruled_out = (
                f"one replica of {target['replicas']} missed the SLO at its share of the target"
            )
        out.append(c)
    return out


@dataclass(frozen=True)
class Ranking:
    """The plan's order, what it ranks by, and the rows tied with its first."""

    order: list[Candidate]  # eligible, by the central figure (best first)
    by: str  # what the order is by
    tied: list[Candidate]  # the first and those whose band overlaps its own (one: no tie)
    note: str  # how the order was made: a missing price, a tie, what broke an equal figure


# Where two rows have the same central figure: more headroom, more KV memory, then the
# shorter readiness (pipeline/plan/readiness.py) go first.
PREFERENCES = "more headroom, then more KV memory, then shorter readiness"


def rank(
    cands: Sequence[Candidate],
    objective: Objective | str,
    prices: Mapping[str, float],
    tolerance: float = 0.0,
) -> Ranking:
    """At a target: by the central $/hour where every eligible device has a price, else by
    the cards it takes (card-hours an hour; the note names the missing prices). Without
    one: by `objective`. The order is the central figure's alone (rows resting on an assumed
    speculative acceptance after every other); rows whose band overlaps the first's are
    `tied` and said, never moved."""
    eligible = [c for c in cands if not c.ruled_out]
    missing = sorted({c.device for c in eligible if c.price(prices) is None})
    sized = any(c.target for c in eligible)
    note = ""
    if missing and (sized or objective == Objective.cost):
        note = (
            f"no price for {', '.join(missing)} (give plan.prices.{missing[0]}=USD per card-hour): "
            + ("ranked by cards (card-hours an hour), not by cost. " if sized else
               "ranked by goodput per card, not by cost. ")
        )  # fmt: skip
    if sized:
        by = "cards" if missing else "usd_per_hour"
    elif objective == Objective.cost and not missing:
        by = "cost_per_mtok_usd"
    else:
        by = "goodput_per_card"
    order = sorted(eligible, key=lambda c: _sort_key(c, by, prices))
    tied = _tied(order, by, prices, tolerance)
    if len(tied) > 1:
        jobs = ", ".join(str(c.job.num) for c in tied[1:])
        note += (
            f"tie: jobs {jobs} lie within the band (or the search tolerance) of job "
            f"{tied[0].job.num}'s {by}; the order stays by the central figure. "
        )
    note += _equal_first(order, by, prices)
    return Ranking(order, by, tied, note.strip())


def central(c: Candidate, by: str, prices: Mapping[str, float]) -> float:
    """The row's central figure of `by`, lower first (goodput negated); inf: none."""
    if by == "usd_per_hour":
        value = c.usd_per_hour(prices)
    elif by == "cards":
        value = float(c.cards)
    elif by == "cost_per_mtok_usd":
        value = c.cost_per_mtok(prices)
    else:
        value = -c.goodput_per_card
    return math.inf if value is None else value


def _preference(c: Candidate) -> tuple[float, float, float]:
    """PREFERENCES as a sort key."""
    headroom = float(c.target["headroom"]) if c.target else 0.0
    return (-headroom, -c.kv_tokens, c.ready_s)


def _sort_key(c: Candidate, by: str, prices: Mapping[str, float]) -> tuple[float, ...]:
    return (float(c.acceptance_assumed), central(c, by, prices), *_preference(c))


def _equal_first(order: Sequence[Candidate], by: str, prices: Mapping[str, float]) -> str:
    """For each row whose central figure equals the next one's: what put it first."""
    notes = []
    for first, second in zip(order, order[1:], strict=False):
        if _sort_key(first, by, prices)[:2] == _sort_key(second, by, prices)[:2]:
            notes.append(_broken_by(first, second, by))
    return " ".join(notes)


def _broken_by(first: Candidate, second: Candidate, by: str) -> str:
    names = ("headroom", "KV tokens", "ready s")
    for name, mine, theirs in zip(names, _preference(first), _preference(second), strict=True):
        if mine != theirs:
            shown = (mine, theirs) if name == "ready s" else (-mine, -theirs)
            fmt = "{:+.0%}" if name == "headroom" else "{:,.0f}"
            if fmt.format(shown[0]) == fmt.format(shown[1]):  # apart below the rounding
                fmt = "{:+.2%}" if name == "headroom" else "{:,.2f}"
            return (
                f"jobs {first.job.num} and {second.job.num} have the same {by}: job "
                f"{first.job.num} first ({PREFERENCES}: {name} {fmt.format(shown[0])} "
                f"against {fmt.format(shown[1])})."
            )
    return (
        f"jobs {first.job.num} and {second.job.num} are equal on {by} and on {PREFERENCES}: "
        "the first found kept."
    )


def _interval(c: Candidate, by: str, prices: Mapping[str, float]) -> tuple[float, float]:
    if by == "usd_per_hour":
        return c.usd_per_hour_range(prices) or (math.inf, math.inf)
    if by == "cards":
        return c.cards_range() or (math.inf, math.inf)
    value = c.cost_per_mtok(prices) if by == "cost_per_mtok_usd" else c.goodput_per_card
    if value is None:
        return (math.inf, math.inf)
    low, high = c.band.ends(value)
    return (min(low, high), max(low, high))


def _tied(
    order: list[Candidate], by: str, prices: Mapping[str, float], tolerance: float
) -> list[Candidate]:
    """The first of `order` and every other whose interval overlaps its own, or whose
    central figure is within the search tolerance of it."""
    if not order:
        return []
    first = order[0]
    low, high = _interval(first, by, prices)
    best = central(first, by, prices)
    tied = [first]
    for c in order[1:]:
        lo, hi = _interval(c, by, prices)
        value = central(c, by, prices)
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
