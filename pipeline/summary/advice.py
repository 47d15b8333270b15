"""What a sweep summary concludes: one recommendation per objective, the caveats a figure
needs (an arrival-bound run, a block-size sweep on a profile without a per-block cost,
the bucket grid a Gaudi run predicts), and whether an SLO was set at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.job.slo import slo_was_set
from pipeline.run_folder.output_keys import Effect, effect

__all__ = [
    "Advice",
    "advise",
    "arrival_bound",
    "caveats",
    "engines_line",
    "overall",
    "recommend",
    "slo_was_set",
]

# A run whose device was busy less than this share of its time waited for arrivals: its
# throughput is the offered load's, not the configuration's.
ARRIVAL_BOUND_BUSY = 0.9
TIE = 0.01  # figures within 1% are a tie: the choice goes to the next objective
SHOWN = 4  # a tie's figures named in its line, the best first

# (column, objective's words, higher is better); the first is throughput, then latencies
OBJECTIVES = [
    ("output_throughput", "highest throughput", True),
    ("ttft_p90_ms", "lowest TTFT p90", False),
    ("tpot_p90_ms", "lowest TPOT p90", False),
]
SLO_OBJECTIVE = ("request_goodput", "highest goodput", True)

# what each bucketing's graph count and warmup predict (docs/buckets.md)
GRIDS = {
    "linear": "this tool's linear grid (neither engine's own)",
    "exponential": "this tool's doubling grid (neither engine's own)",
    "fastdeploy": "FastDeploy's HPU runner's own warmup grid (metadata.fastdeploy.*)",
    "vllm_lin": "vllm-gaudi's lin ranges",
    "vllm_exp": "vllm-gaudi's exp ranges",
    "vllm_pad": "vllm-gaudi's pad ranges",
}


class AdviceJob(Protocol):
    num: int
    status: str
    metrics: dict[str, Any]

    @property
    def override_values(self) -> dict[str, str]: ...

    def value(self, column: str) -> float | None: ...

    def ends(self, column: str) -> tuple[float, float] | None: ...


def arrival_bound(jobs: Sequence[AdviceJob]) -> set[int]:
    """The jobs whose throughput the arrivals set, not the configuration: the device idle
    over a tenth of the run, or every ok job's throughput within 1% of the others' (the
    server kept pace with the offered load at every swept value)."""
    ok = [j for j in jobs if j.status == "ok" and j.value("output_throughput") is not None]
    bound = {j.num for j in ok if (j.value("busy_fraction") or 1.0) < ARRIVAL_BOUND_BUSY}
    rates = [j.value("output_throughput") or 0.0 for j in ok]
    if len(ok) > 1 and max(rates) - min(rates) <= TIE * max(rates):
        bound |= {j.num for j in ok}
    return bound


def _label(job: AdviceJob, keys: Sequence[str]) -> str:
    return " ".join(f"{k}={job.override_values.get(k, '')}" for k in keys) or f"job {job.num}"


def _pct(a: float, b: float) -> str:
    return f"{abs(a - b) / b:.0%}" if b else "n/a"


def _figure(column: str, value: float, ends: tuple[float, float] | None = None) -> str:
    """A figure with its unit and, where given, its band's ends in the same unit:
    `1.20 s (1.03-1.37)`."""
    if column.endswith("_ms"):
        per, spec, unit = (1000.0, ".2f", " s") if value >= 1000 else (1.0, ".1f", " ms")
    elif column == "output_throughput":
        per, spec, unit = 1.0, ",.1f", " tok/s"
    else:
        per, spec, unit = 1.0, ".3g", ""
    band = f" ({ends[0] / per:{spec}}-{ends[1] / per:{spec}})" if ends else ""
    return f"{value / per:{spec}}{unit}{band}"


@dataclass(frozen=True)
class Advice:
    """One objective's choice: the job, the column it ranks by, the line that says why,
    and the jobs it ties with (itself only: no tie)."""

    job: AdviceJob
    column: str
    text: str
    tied: tuple[int, ...]


def advise(jobs: Sequence[AdviceJob], keys: Sequence[str], slo: bool) -> list[Advice]:
    """One choice per objective: which swept value, and why (its figure, the runner-up, and
    what it costs on the other figures); with an SLO the goodput's comes first."""
    ok = [j for j in jobs if j.status == "ok"]
    if len(ok) < 2 or not keys:
        return []
    found = []
    for column, words, higher in [*OBJECTIVES, *([SLO_OBJECTIVE] if slo else [])]:
        ranked = [j for j in ok if j.value(column) is not None]
        if len(ranked) < 2:
            continue
        ranked.sort(key=lambda j: j.value(column) or 0.0, reverse=higher)
        found.append(_line(ranked, column, words, keys))
    return found


def recommend(jobs: Sequence[AdviceJob], keys: Sequence[str], slo: bool) -> list[str]:
    """advise's lines, in objective order (summary.md's Recommendation)."""
    return [a.text for a in advise(jobs, keys, slo)]


def overall(advice: Sequence[Advice]) -> Advice | None:
    """The choice a page leads with: by goodput where an SLO was set, else by throughput."""
    by = {a.column: a for a in advice}
    return by.get(SLO_OBJECTIVE[0]) or by.get(OBJECTIVES[0][0]) or (advice[0] if advice else None)


def tied_with(best: AdviceJob, others: Sequence[AdviceJob], column: str) -> list[AdviceJob]:
    """`best` and the jobs whose figure cannot be told from its own: within 1%, or, for
    simulated jobs, their bands (pipeline/plan/bands.py) overlapping."""
    a = best.value(column) or 0.0
    mine = best.ends(column)
    tied = [best]
    for job in others:
        if job is best:
            continue
        b, theirs = job.value(column) or 0.0, job.ends(column)
        overlap = mine is not None and theirs is not None and theirs[0] <= mine[1] \
            and mine[0] <= theirs[1]  # fmt: skip
        if overlap or abs(b - a) <= TIE * abs(a):
            tied.append(job)
    return tied


def _line(ranked: list[AdviceJob], column: str, words: str, keys: Sequence[str]) -> Advice:
    best, second = ranked[0], ranked[1]
    a, b = best.value(column) or 0.0, second.value(column) or 0.0
    tied = tied_with(best, ranked, column)
    why = f"{words} ({_figure(column, a)})"
    if len(tied) > 1:
        # a tie: the figure does not choose; throughput's ties go to the lowest TTFT p90,
        # a latency's to the highest throughput
        if column == "output_throughput":
            best = min(tied, key=lambda j: j.value("ttft_p90_ms") or float("inf"))
            then = "the lowest TTFT p90"
        else:
            best = max(tied, key=lambda j: j.value("output_throughput") or 0.0)
            then = "the highest throughput"
        within = f"{TIE:.0%}" if best.ends(column) is None else "their bands"
        why = (f"{words} is a tie within {within} across {len(tied)} values: "
               f"{_figures(tied, column)}; of those, {then}, at "
               f"{_figure(column, best.value(column) or 0.0, best.ends(column))}")  # fmt: skip
        if column == "output_throughput" and {j.num for j in tied} <= arrival_bound(ranked):
            why += " (arrival-bound: the offered load sets the throughput)"
    else:
        why += f", {_pct(a, b)} ahead of {_label(second, keys)}"
    text = f"- {_label(best, keys)}: {why}{_cost(best, ranked, column)}"
    return Advice(best, column, text, tuple(j.num for j in tied))


def _figures(jobs: Sequence[AdviceJob], column: str) -> str:
    """Each job's figure, with its band where it has one: `900.0 ms (774.0-1026.0)`."""
    shown = [_figure(column, j.value(column) or 0.0, j.ends(column)) for j in jobs[:SHOWN]]
    more = f" and {len(jobs) - SHOWN} more" if len(jobs) > SHOWN else ""
    return ", ".join(shown) + more


def _cost(best: AdviceJob, ranked: list[AdviceJob], column: str) -> str:
    """What the chosen value gives up on the other figures against the best at each."""
    notes = []
    for other, _words, higher in OBJECTIVES:
        if other == column:
            continue
        values = [j.value(other) for j in ranked if j.value(other) is not None]
        mine = best.value(other)
        if mine is None or not values:
            continue
        top = max(values) if higher else min(values)
        if not top:  # the best at 0 (no job met the SLO, say): nothing is given up
            continue
        worse = (top - mine) / top if higher else (mine - top) / top
        if worse > TIE:
            notes.append(f"{other.removesuffix('_ms')} {_pct(mine, top)} "
                         f"{'below' if higher else 'above'} the best")  # fmt: skip
    return "; gives up " + ", ".join(notes) if notes else ""


def caveats(jobs: Sequence[AdviceJob], keys: Sequence[str]) -> list[str]:
    """What a reader must know before trusting the figures."""
    lines = []
    bound = sorted(arrival_bound(jobs))
    if bound:
        lines.append(
            f"arrival-bound jobs {', '.join(map(str, bound))} (throughput within {TIE:.0%} "
            f"of each other, or the device idle over {1 - ARRIVAL_BOUND_BUSY:.0%} of the "
            "run): their throughput is the offered load's; compare them by latency, or "
            "raise the load (workload.rate, workload.time_scale) to rank throughput."
        )
    if "block_size" in keys and any(j.metrics.get("simulated") for j in jobs):
        lines.append(
            "block_size is swept on a simulated profile that has no per-block cost (a "
            "block's gather and launch overhead is unknown): only padding and the pool's "
            "size change with it, so a real device may rank the block sizes otherwise."
        )
    for key in keys:
        if effect(key) is not Effect.timing:  # the jobs did not generate the same tokens
            lines.append(f"{key} {effect(key)}: speed alone does not rank its values.")
    grids = {str(j.metrics.get("bucketing") or "") for j in jobs if j.metrics.get("simulated")}
    named = sorted(GRIDS[g] for g in grids if g in GRIDS)
    if named:
        lines.append("Warmup graphs and hours predict " + "; ".join(named) + ".")
    return lines


def engines_line(jobs: Sequence[AdviceJob]) -> str:
    """Whose step rules, warmup grid and compiles the jobs predict (conf/engine/)."""
    names = sorted({str(j.metrics.get("engine", "native")) for j in jobs})
    line = f"Engine predicted: {', '.join(f'`{n}`' for n in names)}"
    if "native" in names:
        line += (" (`native`: this tool's own scheduler and grids, not a deployed engine's; "
                 "give engine=fastdeploy, vllm, sglang or trtllm to predict one)")  # fmt: skip
    return line + "."
