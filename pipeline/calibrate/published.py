"""Published throughput figures, each simulated the way it was measured.

A row of a published-measurements CSV (pipeline/calibrate/data/published-measurements.csv holds
56, with their sources) names a device, a model preset, tensor parallelism, precision,
fixed prompt and output lengths and a method:

- `offline` (trtllm-bench throughput): every request queued at once, admitted only when
  the KV cache holds them to their end (its default GUARANTEED_NO_EVICT policy), prompts
  chunked in whole blocks beside the running decodes (`--enable_chunked_context` is
  trtllm-bench's default, tensorrt_llm/bench/benchmark/throughput.py), under the batch
  and token limits trtllm-bench derives: the requests the KV cache holds at input +
  output tokens each, at most 4096, and batch x (1 + input / output) tokens a step, at
  most 32768 (tensorrt_llm/bench/build/tuning.py). KV blocks of 32 tokens, the real
  tokens computed (no padding).
- `static` (Optimum Habana's run_generation.py): `scheduler=static` with the row's batch,
  prefilled together and decoded in lockstep, on warmed buckets of 128 tokens (the
  method's bucket_size), exactly the shapes the batch runs. Every published run sets
  `--attn_batch_split 2` (the run_cmd of each ref_perf entry in Gaudi_1-21.json): the
  prompt's batch is split in two so that one half's all-reduces run under the other
  half's compute (`executor.prefill_batch_split=2`).

The predicted figure is output tokens over the simulated run's time, as both sources
report it. A fit re-times recorded steps (`RowRun.steps`) for other hardware figures: a
run's schedule does not depend on the device's speed when every request is there at the
start, so its steps stay the same.
"""

from __future__ import annotations

import csv
import enum
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from pipeline.config.compose import compose_config
from pipeline.executors.build import build
from pipeline.executors.simulated import build_simulated_engine, simulated_device
from pipeline.job.metrics import StepTotals
from pipeline.job.serving import warm_up
from stages.arithmetic import ceil_div
from stages.scheduling.request import FinishReason, Request
from stages.simulator.cost_model import CostModel
from stages.simulator.device import VirtualClock
from stages.simulator.hardware import HardwareProfile, kv_pool_blocks
from stages.simulator.precision import KvCacheDtype, Precision, Quantization
from stages.simulator.step_work import StepAmounts

# The source checkout (or the installed packages): the recorded-fit digest reads the code.
REPO = Path(__file__).resolve().parents[2]
# The published figures and the fit's start ship inside the package (package data).
DATA_DIR = Path(__file__).resolve().parent / "data"
DATA = DATA_DIR / "published-measurements.csv"
INT_FIELDS = ("tp", "input_tokens", "output_tokens", "num_requests")
# trtllm-bench's caps on the batch and on a step's tokens.
MAX_BATCH, MAX_STEP_TOKENS = 4096, 32768
GPU_BLOCK, HPU_BUCKET = 32, 128
HPU_BATCH_SPLIT = 2  # run_generation.py --attn_batch_split 2, as the static rows ran


class Method(enum.StrEnum):
    """How a published figure was measured, the file's `mode` (the module's docstring)."""

    OFFLINE = "offline"  # trtllm-bench throughput: every request queued at once
    STATIC = "static"  # Optimum Habana's run_generation.py: one batch in lockstep


@dataclass(frozen=True)
class PublishedRow:
    source: str
    where: str
    hardware: str
    model_preset: str
    tp: int
    quantization: str
    kv_cache_dtype: str
    mode: Method
    input_tokens: int
    output_tokens: int
    batch_size: int  # static rows; 0 for offline
    num_requests: int
    value: float  # output tokens per second of the replica
    method: str = ""

    @property
    def label(self) -> str:
        batch = f" bs{self.batch_size}" if self.batch_size else ""
        model = self.model_preset.replace("llama31_", "")
        return f"{model} tp{self.tp} {self.input_tokens}/{self.output_tokens}{batch}"


def read_rows(path: str | Path) -> list[PublishedRow]:
    """The rows of a published-measurements CSV; a bad row is a one-line error naming it."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--published {path}: no such file")
    with open(file, newline="", encoding="utf-8") as f:
        lines = list(csv.DictReader(f))
    rows = []
    for number, line in enumerate(lines, start=2):
        try:
            rows.append(_row(line))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path} line {number}: {err}") from err
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _row(line: dict[str, str]) -> PublishedRow:
    if line.get("metric") != "output_throughput":
        raise ValueError(f"metric={line.get('metric')!r}: only output_throughput is simulated")
    methods = [m.value for m in Method]
    if line["mode"] not in methods:
        raise ValueError(f"mode={line['mode']!r}: choose one of {', '.join(methods)}")
    Precision(
        Quantization(line["quantization"]), KvCacheDtype(line["kv_cache_dtype"])
    )  # a bad name fails here
    values = {k: int(line[k]) for k in INT_FIELDS}
    batch = int(line["batch_size"] or 0)
    if line["mode"] == Method.STATIC and batch < 1:
        raise ValueError("a static row needs batch_size >= 1")
    value = float(line["value"])
    if min(values.values()) < 1 or not value > 0:
        raise ValueError("tp, lengths, num_requests and value must be positive")
    return PublishedRow(
        source=line["source"],
        where=line["where"],
        hardware=line["hardware"],
        model_preset=line["model_preset"],
        quantization=line["quantization"],
        kv_cache_dtype=line["kv_cache_dtype"],
        mode=Method(line["mode"]),
        batch_size=batch,
        value=value,
        method=line.get("method", ""),
        **values,
    )


def _blocks(tokens: int, size: int) -> int:
    return ceil_div(tokens, size)


def row_overrides(row: PublishedRow) -> list[str]:
    """The row's simulated deployment, before its batch limits."""
    common = [
        "executor=simulated",
        f"model=spec/{row.model_preset}",
        f"hardware={row.hardware}",
        f"tp={row.tp}",
        f"quantization={row.quantization}",
        f"kv_cache_dtype={row.kv_cache_dtype}",
        f"max_model_len={row.input_tokens + row.output_tokens}",
        "prefix_caching=false",
        "workload.num_requests=1",  # the row's own requests replace the workload's
        "workload.min_prompt_tokens=1",
        "workload.max_prompt_tokens=1",
    ]
    if row.mode == Method.OFFLINE:
        return [
            *common,
            f"block_size={GPU_BLOCK}",
            "scheduler=chunked",
            "scheduler.budget=real",
            "scheduler.no_evict=true",
        ]
    bs, first = row.batch_size, _blocks(row.input_tokens, HPU_BUCKET)
    last = _blocks(row.input_tokens + row.output_tokens, HPU_BUCKET)
    decode_blocks = ",".join(str(bs * k) for k in range(first, last + 1))
    return [
        *common,
        f"block_size={HPU_BUCKET}",
        "scheduler=static",
        f"executor.prefill_batch_split={HPU_BATCH_SPLIT}",
        f"max_num_seqs={bs}",
        f"max_tokens={bs * first * HPU_BUCKET}",
        "warmup=true",
        f"metadata.prefill_batch.sizes=[{bs}]",
        f"metadata.prefill_seq.sizes=[{first * HPU_BUCKET}]",
        f"metadata.prefill_blocks.sizes=[{first}]",
        f"metadata.decode_batch.sizes=[{bs}]",
        f"metadata.decode_blocks.sizes=[{decode_blocks}]",
    ]


def offline_limits(row: PublishedRow, pool_tokens: int) -> tuple[int, int]:
    """trtllm-bench's max batch size and max tokens a step for the row: the requests the
    KV cache holds at full length, capped, rounded up as its tuning rounds them."""
    requests = min(pool_tokens / (row.input_tokens + row.output_tokens), MAX_BATCH)
    tokens = min(requests * (1 + row.input_tokens / row.output_tokens), MAX_STEP_TOKENS)
    if requests < 256:
        batch = max(64, 32 * math.ceil(requests / 32))
    elif requests < 1024:
        batch = 128 * math.ceil(requests / 128)
    else:
        batch = 256 * math.ceil(requests / 256)
    step = 256 if tokens < 4096 else 512 if tokens < 8192 else 1024
    return batch, max(2048, step * math.ceil(tokens / step))


def row_config(row: PublishedRow, hardware: HardwareProfile | None = None) -> DictConfig:
    """The composed config of the row's simulated run, its limits set by its method."""
    cfg = compose_config(row_overrides(row))
    if row.mode == Method.OFFLINE:
        spec, profile = build(cfg.model), hardware or build(cfg.hardware)
        precision = Precision(Quantization(row.quantization), KvCacheDtype(row.kv_cache_dtype))
        pool = kv_pool_blocks(spec, profile, GPU_BLOCK, row.tp, precision) * GPU_BLOCK
        batch, tokens = offline_limits(row, pool)
        cfg.max_num_seqs, cfg.max_tokens = batch, max(tokens, batch)
    return cfg


def fixed_requests(row: PublishedRow) -> list[Request]:
    """The row's requests: fixed lengths, all there at the start, outputs to their end."""
    prompt = [3 + i % 200 for i in range(row.input_tokens)]  # read, never changed
    return [
        Request(f"r{i}", i, "fixed", prompt, row.output_tokens, ignore_eos=True)
        for i in range(row.num_requests)
    ]


@dataclass
class RowRun:
    row: PublishedRow
    predicted: float  # output tokens per second
    duration_s: float
    output_tokens: int
    num_steps: int
    wall_s: float  # the simulation's own time
    cpu_s: float  # ... in this process's CPU seconds (what a shared machine leaves of it)
    cost: CostModel  # the model, tp and precision the row ran on
    steps: list[tuple[StepAmounts, int]] = field(default_factory=list)

    @property
    def error(self) -> float:
        """Relative error of the prediction: (predicted - published) / published."""
        return self.predicted / self.row.value - 1.0


def simulate_row(
    row: PublishedRow, hardware: HardwareProfile | None = None, record: bool = False
) -> RowRun:
    """Serves the row's requests on the simulated device (the config's profile, or
    `hardware`); `record` keeps each step's amounts for re-timing."""
    start, cpu = time.perf_counter(), time.process_time()
    cfg = row_config(row, hardware)
    engine, _ = build_simulated_engine(cfg, VirtualClock(), hardware)
    device = simulated_device(engine)
    if record:
        device.record()
    warm_up(cfg, engine)
    requests = fixed_requests(row)
    totals = StepTotals()
    # A recording device keeps each step's amounts, so it runs every step alone.
    duration = engine.run(requests, totals.add, on_run=None if record else totals.add_run)
    failed = [r for r in requests if r.finish_reason == FinishReason.ERROR]
    if failed:
        raise ValueError(f"{row.label} on {row.hardware}: {failed[0].error}")
    tokens = sum(len(r.output_ids) for r in requests)
    return RowRun(
        row=row,
        predicted=tokens / duration,
        duration_s=duration,
        output_tokens=tokens,
        num_steps=totals.num_steps,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu,
        cost=device.cost,
        steps=list(device.recorded or ()),
    )


def group_key(row: PublishedRow) -> tuple[str, str]:
    return row.source, row.hardware


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def error_lines(runs: Sequence[RowRun]) -> list[str]:
    """Per source and device: each row's predicted and published figure and its error, then
    the median and worst absolute error."""
    lines: list[str] = []
    groups: dict[tuple[str, str], list[RowRun]] = {}
    for r in runs:
        groups.setdefault(group_key(r.row), []).append(r)
    for (source, hardware), members in groups.items():
        lines += ["", f"{source} on {hardware}"]
        lines.append(f"  {'row':<28}{'predicted':>11}{'published':>11}{'error':>9}{'cpu s':>8}")
        for r in members:
            lines.append(
                f"  {r.row.label:<28}{r.predicted:>11.0f}{r.row.value:>11.0f}"
                f"{r.error:>+9.1%}{r.cpu_s:>8.2f}"
            )
        errors = [abs(r.error) for r in members]
        lines.append(f"  median error {median(errors):.1%}, worst {max(errors):.1%}")
    return lines
