"""Markdown tables of served runs: latency, throughput and the floor; per-step overhead."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import ServedRun

RUN_HEADER = [
    "| scenario | requests | output tok/s | wall s | TTFT p50 / p99 ms | TPOT p50 ms "
    "| ITL p50 / p99 ms | E2E p50 ms | floor s | floor / wall |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def run_row(name: str, run: ServedRun) -> str:
    m = run.metrics
    cells = [
        name,
        str(m["num_requests"] - m["num_errors"])
        + (f" ({m['num_errors']} failed)" if m["num_errors"] else ""),
        f"{m['output_throughput']:.1f}",
        f"{m['duration_s']:.2f}",
        f"{_ms(m['ttft_ms']['p50'])} / {_ms(m['ttft_ms']['p99'])}",
        _ms(m["tpot_ms"]["p50"]),
        f"{_ms(m['itl_ms']['p50'])} / {_ms(m['itl_ms']['p99'])}",
        _ms(m["e2e_ms"]["p50"]),
        f"{run.floor_s:.2f}",
        f"{run.floor_fraction:.3f}",
    ]
    return "| " + " | ".join(cells) + " |"


def run_table(runs: Sequence[tuple[str, ServedRun]]) -> list[str]:
    return [*RUN_HEADER, *(run_row(name, run) for name, run in runs)]


def overhead_table(run: ServedRun) -> list[str]:
    """Where a full decode step's time goes: the decode-only steps with the most requests."""
    decodes = [len(s.record.decode) for s in run.steps if s.record.mode == "decode"]
    if not decodes:
        return ["No decode-only steps."]
    most = max(decodes)
    mean = run.overhead(most)
    step = mean.pop("step")
    count = int(mean.pop("steps"))
    outside = step - mean["forward"]
    lines = [
        f"Per-step time over the {count} decode-only steps with {most} running requests: "
        f"{step * 1e3:.2f} ms a step, of which {outside * 1e3:.2f} ms "
        f"(**{outside / step:.1%}**) is outside the model forward (attention included in "
        "the forward).",
        "",
        "| part of the step | ms / step | share |",
        "| --- | ---: | ---: |",
    ]
    for name, seconds in sorted(mean.items(), key=lambda item: -item[1]):
        if not name.startswith("forward: "):
            lines.append(f"| {name} | {seconds * 1e3:.3f} | {seconds / step:.1%} |")
        if name == "forward":
            inner = {k: v for k, v in mean.items() if k.startswith("forward: ")}
            for part, part_s in sorted(inner.items(), key=lambda item: -item[1]):
                lines.append(f"| {part} | {part_s * 1e3:.3f} | {part_s / step:.1%} |")
            rest = seconds - sum(inner.values())
            label = "forward: the rest (MLP, norms, embedding, lm head)"
            lines.append(f"| {label} | {rest * 1e3:.3f} | {rest / step:.1%} |")
    return lines


def machine_line(rate: float, threads: int) -> str:
    return (
        f"{threads} Paddle threads. Floor = the run's model "
        "FLOPs (benchmarks/floor.py) over paddle.matmul's fp32 rate on the model's "
        "projection shapes, measured in the same process just before and after each run "
        f"(the higher of the two; {rate / 1e9:.0f} GFLOP/s for the first run); floor / wall "
        "is the fraction of the machine's limit reached."
    )


def write_report(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
