"""The latency and transfer checks of benchmarks/published_disagg.py.

Latency (pipeline/calibrate/data/published-disagg-latency.csv): each row served on the
simulated device as published, closed loop, its TTFT and TPOT means against the published
TTFT and inter-token latency. Each row names the engine profile of the release it ran
(`profile`: vllm_v0 for vLLM 0.6.3, vllm for V1) and its scheduler, KV block size,
max_model_len, step token budget and max_num_seqs (the vLLM 0.6.3 rows: that release's
defaults, KV blocks of 16 tokens, max_num_seqs 256, chunked prefill off at a max_model_len
of 3500, so whole prompts and a step budget of max(max_model_len, 2048) = 3500 tokens; a
V1 row: its deploy files' block size and max_model_len, V1's defaults otherwise). CUDA
graphs captured (warmup); every request sent at once up to the concurrency, and the row's
`requests` in all (the vLLM 0.6.3 rows: 10 x concurrency, as GenAI-Perf's
`--request-count`; its 10 warm-up requests are not served); a disaggregated row on its
engine's path (`disagg.engine`, stages/simulator/disagg_engines.py) behind its router's
policy (`disagg.router`: a row's `router`, pipeline/disagg/routing.py) over the h100
profile's KV link (one 400 Gb/s adapter a GPU: the pools sat on two nodes). The vLLM 0.6.3
profile's (`engine=vllm_v0`) host time a step and GEMM rate `fit_engine` sets from the
`fit` rows alone (all of them vLLM 0.6.3's): a grid over the three
figures and two finer ones around its best, the figures whose TTFT and ITL errors on those
rows have the least sum of squares (an aggregated control's TTFT left out: the two
published for one setting differ by 40%).

Transfer (published-kv-transfer.csv): each row's bytes and pieces over its link, at the
h100 profile's per-piece time, against the published time.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from pipeline.plan.capacity import run_probe

DATA_DIR = Path(__file__).resolve().parents[1] / "pipeline/calibrate/data"
LATENCY = DATA_DIR / "published-disagg-latency.csv"
TRANSFER = DATA_DIR / "published-kv-transfer.csv"
# fit_engine's grid: seconds a step, seconds a row, GEMM rate; then one finer round
STEP_HOST_S = (0.0, 0.001, 0.002, 0.003, 0.004)
ROW_HOST_S = (0.0, 50e-6, 100e-6, 150e-6, 200e-6)
GEMM_RATE = (0.7, 0.75, 0.8, 0.85, 0.9, 1.0)


@dataclass(frozen=True)
class LatencyCheck:
    row: dict[str, str]
    ttft_ms: float
    itl_ms: float
    parts_ms: dict[str, float]  # TTFT's parts' means (disaggregated rows)

    @property
    def disaggregated(self) -> bool:
        return self.row["kind"] == "disaggregated"

    @property
    def ttft_error(self) -> float:
        return self.ttft_ms / float(self.row["ttft_ms"]) - 1

    @property
    def itl_error(self) -> float:
        return self.itl_ms / float(self.row["itl_ms"]) - 1


# A row's settings by column and the key each sets; a file without a column (or a row with
# it empty) leaves the key at the config's default
STATED = {"profile": "engine", "kv_cache_dtype": "kv_cache_dtype", "block_size": "block_size",
          "max_num_seqs": "max_num_seqs", "scheduler": "scheduler",
          "max_model_len": "max_model_len", "max_batched_tokens": "max_tokens"}  # fmt: skip


def latency_overrides(row: dict[str, str], engine: Sequence[str] = ()) -> list[str]:
    """The row's deployment and closed loop, with the settings assumed above (`engine`:
    overrides of the engine profile's figures, as a fit tries them)."""
    isl, osl = int(row["input_tokens"]), int(row["output_tokens"])
    stated = [f"{key}={row[column]}" for column, key in STATED.items() if row.get(column)]
    common = [
        "executor=simulated", f"hardware={row['hardware']}", f"model=spec/{row['model']}",
        *stated, *engine, f"quantization={row['quantization']}", "warmup=true",
        "workload=synthetic", f"workload.num_requests={row['requests']}",
        f"workload.min_prompt_tokens={isl}", f"workload.max_prompt_tokens={isl}",
        f"workload.min_new_tokens={osl}", f"workload.max_new_tokens={osl}", "workload.rate=0",
        f"workload.concurrency={row['concurrency']}",
    ]  # fmt: skip
    if row["kind"] != "disaggregated":
        return [*common, f"tp={row['tp']}"]
    return [
        *common, f"disagg.prefill={row['prefill']}", f"disagg.prefill_tp={row['prefill_tp']}",
        f"disagg.decode={row['decode']}", f"disagg.decode_tp={row['decode_tp']}",
        f"disagg.engine={row['engine']}",
        f"disagg.router={row.get('router') or 'round_robin'}",  # a file without the column
    ]  # fmt: skip


def check_latency(row: dict[str, str], engine: Sequence[str] = ()) -> LatencyCheck:
    """Serves the row once; its TTFT and TPOT means (and TTFT's parts)."""
    cfg = compose_config(latency_overrides(row, engine))
    with tempfile.TemporaryDirectory() as folder:
        metrics = run_probe(cfg, Path(folder), keep_files=False, decide_early=False)
    parts = (metrics.get("disagg") or {}).get("ttft_parts_ms") or {}
    return LatencyCheck(
        row, metrics["ttft_ms"]["mean"], metrics["tpot_ms"]["mean"],
        {part: stat["mean"] for part, stat in parts.items()},
    )  # fmt: skip


def fit_errors(check: LatencyCheck) -> list[float]:
    """The errors a fit weighs of a row: its ITL's, and its TTFT's unless it is a control."""
    return [check.itl_error, check.ttft_error] if check.disaggregated else [check.itl_error]


def fit_cost(rows: Sequence[dict[str, str]], figures: tuple[float, float, float]) -> float:
    """The sum of squared errors of `rows` served with the figures (step, row, rate)."""
    step_s, row_s, rate = figures
    engine = [f"engine.step_host_s={step_s:g}", f"engine.row_host_s={row_s:g}",
              f"engine.gemm_rate={rate:g}"]  # fmt: skip
    return sum(e * e for row in rows for e in fit_errors(check_latency(row, engine)))


def fit_engine(rows: Sequence[dict[str, str]]) -> tuple[tuple[float, float, float], float]:
    """The figures (step_host_s, row_host_s, gemm_rate) of the grid above with the least
    fit_cost on the `fit` rows, then of grids half and a quarter as wide around the best so
    far; and that cost."""
    fit = [row for row in rows if row.get("role") == "fit"]
    costs = {f: fit_cost(fit, f) for f in itertools.product(STEP_HOST_S, ROW_HOST_S, GEMM_RATE)}
    best = min(costs, key=lambda figures: costs[figures])
    for share in (0.5, 0.25):
        steps = (0.001 * share, 50e-6 * share, 0.05 * share)  # the grid's spacing
        around = itertools.product(
            *((max(0.0, x - h), x, x + h) for x, h in zip(best, steps, strict=True))
        )
        for figures in around:
            if figures[2] <= 1 and figures not in costs:
                costs[figures] = fit_cost(fit, figures)
        best = min(costs, key=lambda figures: costs[figures])
    return best, costs[best]


def piece_seconds(hardware: str = "h100") -> float:
    """A device profile's per-piece time (kv_link_piece_s)."""
    cfg = compose_config(["executor=simulated", f"hardware={hardware}"])
    return float(build(cfg.hardware).kv_link_piece_s)


def transfer_ms(row: dict[str, str], piece_s: float) -> float:
    """The row's bytes over its link plus its pieces at `piece_s`, in milliseconds."""
    seconds = float(row["bytes"]) / (float(row["link_gbps"]) * 1e9) + int(row["pieces"]) * piece_s
    return seconds * 1e3


def spread(errors: list[float]) -> dict[str, float | None]:
    """The median and worst absolute error of signed relative errors (None: no rows)."""
    magnitudes = [abs(e) for e in errors]
    if not magnitudes:
        return {"median": None, "worst": None}
    return {"median": statistics.median(magnitudes), "worst": max(magnitudes)}
