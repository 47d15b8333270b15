"""A plan's table (plan.md, plan.csv) and its Pareto plot, every predicted figure with its
band: in plan.md as `6.1 (5.6-6.6)`, in plan.csv as the figure and `_lo` / `_hi` columns.

Per replica: `capacity`, `capacity_rps`, `ttft_p90_ms`, `tpot_p90_ms`, `tp`, `replica_cards`
(its cards: pipeline/config/layout.py) and, where any row sets them, `ep_dp` (ep/dp), `p_d`
(prefill:decode instances) and `speculative` (method/tokens).
Per card: `goodput_per_card` (capacity_rps x attainment / replica_cards),
`output_tok_s_per_card`.
At the target: `replicas`, `cards` (all of them), `headroom`, `check_attainment` (one
replica at its share of the target), `usd_per_hour` (all cards).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.page.axes import Axis, value_axis
from pipeline.plan.acceptance import acceptance_note
from pipeline.plan.bands import Band
from pipeline.plan.candidates import Candidate, pareto_front
from pipeline.run_folder.run_files import write_file
from pipeline.summary import split_override

PLAN_CSV, PLAN_MD, PARETO_PNG = "plan.csv", "plan.md", "pareto.png"

# Figures the device predicts: each carries its band (plan.csv: _lo, _hi columns).
BANDED = (
    "capacity", "capacity_rps", "goodput_per_card", "output_tok_s_per_card", "tok_s_per_user",
    "ttft_p90_ms", "tpot_p90_ms", "usd_per_hour", "cost_per_mtok_usd",
)  # fmt: skip
LAYOUT_COLUMNS = ("ep_dp", "p_d", "speculative")  # shown only where a row sets one
COLUMNS = [
    "rank", "tie", "job", "device", "config", "tp", *LAYOUT_COLUMNS, "replica_cards", "capacity",
    "capacity_rps", "slo_attainment",
    "goodput_per_card", "output_tok_s_per_card", "tok_s_per_user", "ttft_p90_ms",
    "tpot_p90_ms", "replicas", "cards", "headroom", "check_attainment", "usd_per_hour",
    "cost_per_mtok_usd", "band", "ready_s", "warmup_s", "graphs", "kv_blocks",
    "serving_compiles", "note",
]  # fmt: skip


def row(
    c: Candidate,
    keys: Sequence[str],
    prices: Mapping[str, float],
    rank: int | None = None,
    tie: str = "",
) -> dict[str, Any]:
    """One configuration's figures (bands aside: see band_ends); `tie`: the job whose band
    this row's overlaps ("" = none)."""
    own = [o for o in c.job.overrides if split_override(o)[0] in keys]
    notes = [c.ruled_out, acceptance_note(c.config)]
    if c.compiles and not c.ruled_out:
        seconds = c.metric("serving_compile_s") or 0.0
        notes.append(f"compiled {graphs_text(c.compiles)} while serving ({seconds:,.0f} s)")
    note = "; ".join(n for n in notes if n)
    target = c.target or {}
    return {
        "rank": rank,
        "tie": tie or None,
        "job": c.job.num,
        "device": c.device,
        "config": " ".join(own),
        "tp": c.tp,
        **c.layout.columns(),
        "replica_cards": c.replica_cards,
        "capacity": c.capacity,
        "capacity_rps": c.capacity_rps,
        "slo_attainment": c.metric("slo_attainment"),
        "goodput_per_card": c.goodput_per_card,
        "output_tok_s_per_card": c.tokens_per_card,
        "tok_s_per_user": c.tokens_per_user,
        "ttft_p90_ms": c.metric("ttft_ms", "p90"),
        "tpot_p90_ms": c.metric("tpot_ms", "p90"),
        "replicas": target.get("replicas"),
        "cards": c.cards if target else None,
        "headroom": target.get("headroom"),
        "check_attainment": target.get("check_attainment"),
        "usd_per_hour": c.usd_per_hour(prices) if target else None,
        "cost_per_mtok_usd": c.cost_per_mtok(prices),
        "band": f"+-{c.band.relative:.0%}" + (" unchecked" if c.band.unchecked else ""),
        "ready_s": c.metric("ready_s"),
        "warmup_s": c.metric("predicted_warmup_s"),
        "graphs": c.metric("warmup_shapes"),
        "kv_blocks": c.metric("num_blocks"),
        "serving_compiles": c.compiles,
        "note": note,
    }


def band_ends(
    c: Candidate, r: Mapping[str, Any], prices: Mapping[str, float]
) -> dict[str, tuple[float, float]]:
    """Each banded figure's (low, high): the band around it; $/hour re-rounds replicas."""
    ends: dict[str, tuple[float, float]] = {}
    for key in BANDED:
        value = r.get(key)
        if isinstance(value, (int, float)):
            low, high = c.band.ends(float(value))
            ends[key] = (min(low, high), max(low, high))
    spread = c.usd_per_hour_range(prices)
    if spread is not None and r.get("usd_per_hour") is not None:
        ends["usd_per_hour"] = spread
    return ends


def graphs_text(n: int) -> str:
    return f"{n} graph" if n == 1 else f"{n} graphs"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _cell(key: str, r: Mapping[str, Any], ends: Mapping[str, tuple[float, float]]) -> str:
    value = r[key]
    if key == "headroom" and value is not None:
        return f"{value:+.0%}"
    if key in ends and value is not None:
        low, high = ends[key]
        if (low, high) != (value, value):
            return f"{_fmt(float(value))} ({_fmt(low)}-{_fmt(high)})"
    return _fmt(value)


def write_table(
    cands: Sequence[Candidate],
    rows: list[dict[str, Any]],
    prices: Mapping[str, float],
    header: str,
    folder: Path,
) -> str:
    """plan.csv and plan.md; returns the markdown table."""
    ends = [band_ends(c, r, prices) for c, r in zip(cands, rows, strict=True)]
    shown = shown_columns(rows)
    fields = [*shown]
    for key in BANDED:
        at = fields.index(key) + 1
        fields[at:at] = [f"{key}_lo", f"{key}_hi"]
    csv_text = io.StringIO(newline="")
    writer = csv.DictWriter(csv_text, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r, e in zip(rows, ends, strict=True):
        flat = {k: "" if v is None else v for k, v in r.items()}
        for key, (low, high) in e.items():
            flat[f"{key}_lo"], flat[f"{key}_hi"] = low, high
        writer.writerow(flat)
    write_file(folder / PLAN_CSV, csv_text.getvalue())
    lines = [
        "| " + " | ".join(shown) + " |",
        "| " + " | ".join("---" for _ in shown) + " |",
        *(
            "| " + " | ".join(_cell(k, r, e).replace("|", "\\|") for k in shown) + " |"
            for r, e in zip(rows, ends, strict=True)
        ),
    ]
    table = "\n".join(lines)
    write_file(folder / PLAN_MD, f"{header}\n\n{table}\n\n![Pareto front]({PARETO_PNG})\n")
    return table


def shown_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """COLUMNS less the layout columns no row sets (every cell "-")."""
    unset = {k for k in LAYOUT_COLUMNS if all(r.get(k, "-") == "-" for r in rows)}
    return [k for k in COLUMNS if k not in unset]


def write_pareto(cands: Sequence[Candidate], chosen: Candidate | None, path: Path) -> None:
    """Output tokens/s per card against tokens/s per user, by device, with each point's
    band as an error bar, the front and the best marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    shown = [c for c in cands if c.tokens_per_user is not None and not c.ruled_out]
    for device in sorted({c.device for c in shown}):
        mine = [c for c in shown if c.device == device]
        x = [c.tokens_per_user or 0.0 for c in mine]
        y = [c.tokens_per_card for c in mine]
        bands: list[Band] = [c.band for c in mine]
        label = f"{device} (band +-{bands[0].relative:.0%}: plan.md says of what)"
        ax.errorbar(x, y, xerr=_errors(bands, x), yerr=_errors(bands, y), fmt="o", alpha=0.7,
                    capsize=2, label=label)  # fmt: skip
        for c in mine:
            ax.annotate(str(c.job.num), (c.tokens_per_user, c.tokens_per_card), fontsize=7)
    front = pareto_front(cands)
    ax.plot([c.tokens_per_user for c in front], [c.tokens_per_card for c in front], "-",
            color="black", label="Pareto front")  # fmt: skip
    if chosen is not None and chosen.tokens_per_user is not None:
        ax.scatter([chosen.tokens_per_user], [chosen.tokens_per_card], s=160, marker="*",
                   color="tab:red", label=f"best (job {chosen.job.num})", zorder=3)  # fmt: skip
    x_rule = _axis([c.tokens_per_user or 0.0 for c in shown], [c.band for c in shown])
    y_rule = _axis([c.tokens_per_card for c in shown], [c.band for c in shown])
    for rule, scale, limits in ((x_rule, ax.set_xscale, ax.set_xlim),
                                (y_rule, ax.set_yscale, ax.set_ylim)):  # fmt: skip
        scale("log" if rule.log else "linear")
        limits(rule.start, rule.end)
    ax.set_xlabel(f"output tokens/s per user (1000 / mean TPOT ms)\n{x_rule.note}", fontsize=9)
    ax.set_ylabel("output tokens/s per card, one replica at capacity")
    ax.set_title("Plan: each configuration at its capacity under the SLO (simulated)\n"
                 f"y {y_rule.note}", fontsize=10)  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # clear of the points
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_file(path, png.getvalue())


def _errors(bands: Sequence[Band], values: Sequence[float]) -> list[list[float]]:
    """Matplotlib's (below, above) error bars: each value's band's ends."""
    ends = [b.ends(v) for b, v in zip(bands, values, strict=True)]
    return [[v - lo for (lo, _), v in zip(ends, values, strict=True)],
            [hi - v for (_, hi), v in zip(ends, values, strict=True)]]  # fmt: skip


def _axis(values: Sequence[float], bands: Sequence[Band]) -> Axis:
    """The plot's axes follow the one rule of every chart (pipeline/page/axes.py)."""
    ends = [b.ends(v) for b, v in zip(bands, values, strict=True)]
    return value_axis(list(values), [lo for lo, _ in ends], [hi for _, hi in ends])
