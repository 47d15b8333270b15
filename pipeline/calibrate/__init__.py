"""`python -m pipeline.calibrate [overrides]`: fit the simulated device to this machine.

(`python -m pipeline.calibrate --published FILE hardware=NAME` fits a device's profile to
published figures instead: pipeline.calibrate.fit.)

Serves the configured workload for real (executor=paddle) and fits the cost model's
coefficients to its steps: each step's shape and its measured time, scheduling, metadata,
forward and sampling included, which is what a simulated step stands for. The shape is
the padded buckets for a forward that computes them (the HPU's), and the rows' real
lengths for one that packs real tokens (the CPU ops). Real steps read KV blocks spread
over the pool, with mixed prefill+decode shapes and one lm-head row per request, which
padding-only warmup steps do not (`calibrate.grid_shapes=N` adds N of those, where the
forward pads); `calibrate.runs=[RUN,...]` adds the steps of earlier real runs, e.g. served
on an HPU. Writes `hardware.yaml` into the run folder, for `executor=simulated
hardware=measured hardware.path=FILE`. On this machine that calibrates the CPU; on an HPU
with the plugin (`device=intel_hpu attention.ops=intel_hpu`) the same command records the
HPU.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import structlog
from omegaconf import DictConfig, OmegaConf

from pipeline.calibrate.fit import FIT
from pipeline.command import Failure, HydraCommand, Job, OptionChoice
from pipeline.config.checks import ConfigError, describe_model
from pipeline.executors import build_engine, check_config, executor_of
from pipeline.executors.build import check_resolves, import_paddle
from pipeline.job.engine import Engine
from pipeline.job.run import run
from pipeline.run_folder.artefacts import STEPS, read_run_config
from pipeline.run_folder.reader import RunFileError, read_step_lines
from pipeline.run_folder.run_files import output_folder, write_file
from pipeline.schema import HardwareConf, schema_defaults, schema_view
from stages.forward.forward_meta import bucket_dims
from stages.forward.step_shape import StepShape
from stages.simulator.cost_model import CostModel
from stages.simulator.hardware import HardwareProfile, profile_yaml

log = structlog.get_logger(__name__)
# Terms measured steps can tell apart at tp=1: KV writes scale with tokens as the
# projections do, the lm head's rows follow the requests, there is no all-reduce.
FITTED_TERMS = ("linear", "prefill_attention", "decode_attention", "kv_blocks", "overhead")


def timed_calls(fn: Callable[[], object], repeats: int, warm: int = 1) -> list[float]:
    """Seconds of each of `repeats` calls after `warm` untimed ones (first calls pay for
    Paddle's allocations)."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls after a first one."""
    return min(timed_calls(fn, repeats))


def measured_rates(threads: int) -> dict[str, float]:
    """This machine's fp32 matmul rate (FLOP/s) and read bandwidth (bytes/s), best of a few
    tries: the roofline needs the peak to choose each term's regime."""
    import_paddle()  # here, not at the command's start: its --help and checks need no tensors
    import paddle

    paddle.base.core.set_num_threads(threads)
    a, b = paddle.rand([1024, 1024]), paddle.rand([1024, 1024])
    x = paddle.ones([64 * 2**20 // 4])
    matmul_s = best_seconds(lambda: float(paddle.matmul(a, b)[0, 0]), repeats=5)
    read_s = best_seconds(lambda: float(x.sum()), repeats=5)
    return {"flops": 2 * 1024**3 / matmul_s, "bytes": x.shape[0] * 4 / read_s}


def cpu_profile(rates: dict[str, float], pads_to_buckets: bool = False) -> HardwareProfile:
    """The measured peaks as a device profile; coefficients are fitted on top of them.
    pads_to_buckets: whether the forward computes the padded buckets (see pads_buckets)."""
    meminfo = Path("/proc/meminfo").read_text().split()
    capacity = int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20
    measured = {
        "name": "measured-cpu",
        "bf16_tflops": rates["flops"] / 1e12,  # fp32 here: the CPU multiplies in fp32
        "hbm_bandwidth_gbs": rates["bytes"] / 1e9,
        "hbm_capacity_gib": capacity,
        "interconnect_gbs": 1.0,
        "gemm_efficiency": 1.0,
        "attention_efficiency": 1.0,
        "memory_efficiency": 1.0,
        "interconnect_efficiency": 1.0,
        "step_overhead_s": 0.0,
        "compile_s": 0.0,  # eager Paddle compiles nothing: no warmup cost, no miss penalty
        "recompile_s": 0.0,
        "graph_memory_gib": 0.0,
        "pads_to_buckets": pads_to_buckets,
    }
    return HardwareProfile(**{**schema_defaults(HardwareConf), **measured})


def pads_buckets(cfg: DictConfig) -> bool:
    """Whether the configured forward computes the padded buckets. The CPU attention ops
    take each step's real tokens packed (no static shapes to keep), so the GEMMs and
    attention there cost by the real lengths; the HPU's ops compute the padded bucket."""
    from stages.model.attention.paged import load_ops  # Paddle's ops: not for --help

    ops = OmegaConf.select(cfg, "attention.ops")
    return ops is None or not load_ops(ops).packs_rows


def grid(engine: Engine, max_shapes: int) -> list[tuple]:
    """Up to max_shapes (prefill, decode) warmup shapes, spread evenly over each phase."""
    phases = engine.warmup_shapes()
    per_phase = max(1, max_shapes // max(1, len(phases)))
    chosen = []
    for shapes in phases.values():
        picks = np.unique(np.linspace(0, len(shapes) - 1, min(per_phase, len(shapes))).astype(int))
        chosen += [shapes[i] for i in picks]
    return chosen


def time_shape(engine: Engine, prefill: tuple | None, decode: tuple | None) -> float:
    """Best of three: building the step's metadata and running the forward, as a step does."""

    def step() -> None:
        logits = engine.model.forward(engine.metadata.dummy(prefill, decode), engine.attention)
        float(logits[0, 0])  # wait for the device

    return best_seconds(step, repeats=3)


def step_buckets(step: dict) -> tuple[tuple | None, tuple | None]:
    """A steps.jsonl line's (prefill, decode) buckets: its `padded` dims, or the `bucket`
    label of a run written before steps recorded them."""
    if "padded" not in step:
        return bucket_dims(step["bucket"])
    padded = step["padded"]
    prefill, decode = padded.get("prefill"), padded.get("decode")
    return (tuple(prefill) if prefill else None), (tuple(decode) if decode else None)


def run_samples(folder: str | Path, pads_to_buckets: bool) -> list[tuple[StepShape, float]]:
    """A real run's steps as (shape, measured seconds), from its steps.jsonl: the padded
    buckets and, for a device that computes real tokens, each row's real lengths."""
    folder = Path(folder)
    cfg = read_run_config(folder)
    if cfg is None or not (folder / STEPS).is_file():
        raise ConfigError(f"calibrate.runs: {folder} is not a run folder (no config or {STEPS})")
    if executor_of(cfg).predicts:
        raise ConfigError(f"calibrate.runs: {folder} is a simulated run; give real runs")
    try:  # every field checked (a NaN duration would fit NaN coefficients)
        steps = read_step_lines(folder / STEPS)
    except RunFileError as err:
        raise ConfigError(f"calibrate.runs: {err}") from err
    samples = []
    for number, step in enumerate(steps, 1):
        where = f"calibrate.runs: {folder / STEPS} step {number}"
        try:
            prefill, decode = step_buckets(step)
            if not pads_to_buckets and step["decode"] and "decode_lens" not in step:
                raise ConfigError(
                    f"{where}: no decode_lens (a run of an earlier version): serve it again"
                )
            shape = StepShape(
                cfg.block_size,
                prefill,
                decode,
                chunk_lens=tuple(c["end"] - c["start"] for c in step["prefill"]),
                context_lens=tuple(c["start"] for c in step["prefill"]),
                decode_lens=tuple(step.get("decode_lens", ())),
            )
            samples.append((shape, step["duration_s"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{where}: {e}") from e
    return samples


def check_grid(grid_shapes: int, pads_to_buckets: bool) -> None:
    """Refuses timed warmup shapes where they would time nothing but padding."""
    if grid_shapes and not pads_to_buckets:
        raise ConfigError(
            "calibrate.grid_shapes: warmup shapes are padding only, and this forward "
            "computes real tokens (attention.ops packs rows): set calibrate.grid_shapes=0 "
            "and calibrate from served runs"
        )


def calibrate(
    cfg: DictConfig, grid_shapes: int = 0, runs: Sequence[str | Path] = ()
) -> tuple[HardwareProfile, dict, list]:
    """The fitted profile, its coefficients, and the (shape, measured, predicted) samples:
    `grid_shapes` timed warmup shapes of cfg's engine and the steps of the real `runs`."""
    pads, conf = pads_buckets(cfg), schema_view(cfg)
    check_grid(grid_shapes, pads)
    profile = cpu_profile(measured_rates(conf.num_threads), pads)
    spec, _ = describe_model(cfg)
    samples = [s for run in runs for s in run_samples(run, pads)]
    if grid_shapes:
        engine, _ = build_engine(cfg)
        for prefill, decode in grid(engine, grid_shapes):
            shape = StepShape(conf.block_size, prefill, decode)
            samples.append((shape, time_shape(engine, prefill, decode)))
    if not samples:
        raise ConfigError("calibrate: no steps to fit: set calibrate.serve=true, "
                          "calibrate.grid_shapes=N or calibrate.runs=[RUN]")  # fmt: skip
    cost = CostModel(spec, profile)
    try:
        coefficients = cost.fit(samples, terms=FITTED_TERMS, relative=True)
    except ValueError as e:
        raise ConfigError(
            f"calibrate: {e}; here, serve a workload of more varied prompt lengths and "
            "arrivals, or add warmup shapes with calibrate.grid_shapes=N"
        ) from e
    fitted = cost.with_coefficients(coefficients)
    report = [(s, t, fitted.step_time(s)) for s, t in samples]
    return profile, coefficients, report


def error_summary(report: Sequence[tuple]) -> dict[str, float]:
    errors = np.array([abs(p - t) / t for _, t, p in report])
    return {"median_error": float(np.median(errors)), "worst_error": float(errors.max())}


def calibrate_job(cfg: DictConfig, job: Job) -> int:
    """Serves (calibrate.serve), times warmup shapes and reads earlier runs as configured,
    and writes the fitted profile, hardware.yaml, with calibration.json beside it."""
    out_dir, options = job.out_dir, schema_view(cfg).calibrate
    runs: list[str | Path] = list(options.runs)
    if options.serve or options.grid_shapes:  # an engine will be built: Paddle loads
        check_resolves(cfg)  # after the config's checks, so an error costs no import
        check_config(cfg)
    check_grid(options.grid_shapes, pads_buckets(cfg))  # before serving, not after
    if options.serve:
        served = out_dir / "served"
        output_folder(served)
        run(cfg, served)  # a real run folder of its own, summarised as usual
        runs.append(served)
    profile, coefficients, report = calibrate(cfg, options.grid_shapes, runs)
    fitted = profile_yaml("hardware.yaml", profile, coefficients)
    path = write_file(out_dir / "hardware.yaml", fitted)
    summary = {"samples": len(report), **error_summary(report), "coefficients": coefficients}
    write_file(out_dir / "calibration.json", json.dumps(summary, indent=2) + "\n")
    log.info("calibrated", profile=str(path), samples=len(report), **error_summary(report))
    print(f"{path}\n  steps fitted: {len(report)}; fitted step time within "
          f"{summary['median_error']:.1%} (median), {summary['worst_error']:.1%} (worst)\n"
          f"  use: executor=simulated hardware=measured hardware.path={path}")  # fmt: skip
    return 0


# `--published FILE` fits published figures (pipeline.calibrate.fit); without it the
# command calibrates this machine, a Hydra job.
COMMAND = OptionChoice(
    name="pipeline.calibrate",
    option="--published",
    given=FIT,
    otherwise=HydraCommand(
        name="pipeline.calibrate",
        config_name="calibrate",
        run=calibrate_job,
        failures=(Failure((ConfigError,), 2),),
    ),
)
