"""What a simulated build adds to the engine (stages.interfaces.Simulation): warmup
predicted instead of run, runs of decode steps done at once (leaps), and the device's
figures for the run's metrics.

A leap gives exactly what its steps one by one give (tests/test_leaps.py): the planner
reads the scheduler's table for the run (stages.simulator.fast_forward), the metadata
builder pads it to its buckets, the device puts its steps on the clock, and the scheduler
applies what their updates would do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stages.forward.forward_meta import ForwardMeta
from stages.interfaces import AppliesDecodeRuns, PadsDecodeRuns
from stages.scheduling.request import DecodeRun, Request, StepPlan
from stages.simulator.device import SimulatedDevice
from stages.simulator.fast_forward import DecodeRunPlanner

# The most decode steps a leap does at once: long runs gain little more, and a cap keeps
# each leap's arrays small.
MAX_LEAP_STEPS = 128


class DeviceSimulation:
    """The simulated device with the scheduler and metadata builder it leaps with; `token`
    is what every row gets at every step (the sampler's, whatever the logits)."""

    def __init__(
        self,
        device: SimulatedDevice,
        scheduler: AppliesDecodeRuns,
        metadata: PadsDecodeRuns,
        token: int,
        leaps: bool = True,
    ) -> None:
        """leaps: False where runs of decode steps must go step by step (speculative
        decoding moves rows by more than one token a step, which the runs' planner does
        not)."""
        self.device = device
        self.leaps = leaps
        self.scheduler = scheduler
        self.planner = DecodeRunPlanner(scheduler)
        self.metadata = metadata
        self.token = token

    @property
    def serving_compiles(self) -> int:
        return self.device.recompiles

    def predict_warmup(self, phases: Mapping[str, Sequence[tuple]]) -> float:
        return self.device.compile_shapes(phases)

    def leap(
        self,
        until: Callable[[], float],
        finishes: float = 0,
        head: tuple[StepPlan, ForwardMeta] | None = None,
    ) -> tuple[DecodeRun, list[Request]] | None:
        """As many steps as start before `until()` (up to MAX_LEAP_STEPS); see the
        planner's decodes_after for a run with a `head`."""
        if not self.leaps:
            return None
        end = until()
        limit = self.device.steps_before(end, MAX_LEAP_STEPS)  # plans no step past `end`
        if head is None:
            run = self.planner.steady_decodes(limit, finishes)
            run = self.metadata.pad_decodes(run) if run else None
        else:
            run = self.planner.decodes_after(head[0], limit, finishes)
            run = self.metadata.pad_decodes(run, head[1]) if run else None
        if run is None:
            return None
        ends = self.device.run_decodes(run, end)
        run = run.first(len(ends))
        return run, self.scheduler.apply_decodes(run, self.token, ends)

    def metrics(self, warmup_shapes: int) -> dict[str, Any]:
        device = self.device
        return {
            "simulated": True,
            "hardware": device.hardware.name,
            "model": device.spec.name,
            "tp": device.cost.tp,
            "ep": device.cost.parallel.ep,  # experts over ep ranks; one of dp replicas simulated
            "dp": device.cost.parallel.dp,
            "quantization": device.precision.quantization.value,
            "kv_cache_dtype": device.precision.kv_cache_dtype.value,
            "warmup_shapes": warmup_shapes,
            "predicted_warmup_s": device.cost.warmup_time(warmup_shapes),
            "serving_compiles": device.recompiles,
            "serving_compile_s": device.recompiles * device.hardware.recompile_s,
            **speculation_metrics(device),
        }


def speculation_metrics(device: SimulatedDevice) -> dict[str, Any]:
    """The speculation a device prices steps with (nothing without one)."""
    if device.speculative is None:
        return {}
    speculation = device.speculative.speculation
    return {
        "speculative_method": speculation.method,
        "speculative_tokens": speculation.tokens,
        "speculative_expected_tokens": round(speculation.expected_tokens, 4),
        "speculative_proposal_rate": speculation.proposal_rate,
    }
