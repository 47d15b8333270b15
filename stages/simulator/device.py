"""The simulated device: the engine's model, attention and sampler stages for a target the
user does not have. The scheduler, KV-cache manager and metadata builder are the real ones;
each step's time comes from the cost model and advances a virtual clock.

Graphs: like an HPU, the device runs a compiled graph per bucket shape, one for a step's
prefill part and one for its decode part. Warmup compiles every prepared shape (the
predicted warmup time); during serving, a part whose shape was never compiled compiles
first and pays `recompile_s` once. Without warmup, every shape compiles at its first use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stages.forward.engine_grids import step_graphs
from stages.forward.forward_meta import ForwardMeta
from stages.forward.step_shape import StepShape
from stages.model.spec import ModelSpec
from stages.scheduling.request import DecodeRun, Request, Samples
from stages.simulator.cost_model import CostModel
from stages.simulator.expert_parallel import PLAIN, ExpertParallel
from stages.simulator.hardware import HardwareProfile
from stages.simulator.precision import BF16, Precision
from stages.simulator.speculative import Speculation, SpeculativeCost
from stages.simulator.step_work import StepAmounts


class DeviceClock(Protocol):
    """The clock a simulated device puts its steps on: a virtual one, or the wall's where
    a server paces the predicted times in real time."""

    def __call__(self) -> float: ...

    def advance(self, seconds: float) -> None:
        """A step of `seconds` ran."""

    def advance_to(self, t: float) -> None:
        """Steps whose end times were summed up from the clock's own time ran until `t`."""


class VirtualClock:
    """Seconds since the run's start, advanced only by predicted step times and idle gaps,
    never by the simulator's own time."""

    def __init__(self) -> None:
        self._now = 0.0

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def sleep_until(self, t: float) -> None:
        self._now = max(self._now, t)

    def advance_to(self, t: float) -> None:
        """The clock after steps whose end times were summed up from its own time."""
        self._now = t

    def restart(self) -> None:
        self._now = 0.0


@dataclass(frozen=True)
class HostTime:
    """What the serving engine's host work (scheduling, input preparation, the sampler's
    wait) adds to each step beyond the device profile's step overhead, which was fitted on
    another engine: a fixed part and a part per row (prompt or decode) the step runs
    (engine.step_host_s, engine.row_host_s, conf/engine/)."""

    step_s: float = 0.0
    row_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.step_s >= 0 and self.row_s >= 0):
            shown = f"engine.step_host_s={self.step_s} engine.row_host_s={self.row_s}"
            raise ValueError(f"{shown}: each must be >= 0")

    def seconds(self, rows: Any) -> Any:
        """The host time of steps of `rows` rows (a count, or an array: one per step)."""
        return self.step_s + self.row_s * rows


NO_HOST_TIME = HostTime()


def step_rows(shape: StepShape) -> int:
    """The rows a step runs: its prompts' chunks and its decode rows."""
    return len(shape.chunk_lens) + len(shape.decode_lens)


class SimulatedDevice:
    """The Model stage of a simulated run: forward predicts the step's time."""

    dtype = "bfloat16"

    def __init__(
        self,
        spec: ModelSpec,
        hardware: HardwareProfile,
        clock: DeviceClock,
        tp: int = 1,
        precision: Precision = BF16,
        prefill_batch_split: int = 1,
        parallel: ExpertParallel = PLAIN,
        speculation: Speculation | None = None,
        draft: ModelSpec | None = None,
        step_recipes: bool = False,
        host: HostTime = NO_HOST_TIME,
    ) -> None:
        """speculation: every decode row verifies its proposals (and `draft`, a draft
        model's description for method=draft, proposes them): each step is priced so.
        step_recipes: a mixed step also compiles its token-wise ops at its total tokens
        (engine_grids.step_graphs).
        host: the engine's host time a step, beside the device's."""
        self.step_recipes = step_recipes
        self.host = host
        self._no_host = not (host.step_s or host.row_s)  # asked at every step
        self.spec = spec
        self.hardware = hardware
        self.precision = precision
        self.cost = CostModel(
            spec,
            hardware,
            tp,
            precision=precision,
            prefill_batch_split=prefill_batch_split,
            parallel=parallel,
        )
        self.speculative = (
            SpeculativeCost(self.cost, speculation, draft) if speculation is not None else None
        )
        self.clock = clock
        self.compiled: set[tuple] = set()
        self.recompiles = 0
        # A device that pads computes by the buckets alone: the same buckets, the same time.
        self._times: dict[tuple, float] = {}
        # Each step's amounts and compiles when recording (`record()`): what a fit over
        # many runs re-times for other hardware figures without serving them again.
        self.recorded: list[tuple[StepAmounts, int]] | None = None

    def record(self) -> None:
        """Keeps every following step's amounts and compile count in `recorded`."""
        self.recorded = []

    @property
    def num_parameters(self) -> int:
        return self.spec.num_parameters()

    def compile_shapes(self, phases: Mapping[str, Sequence[tuple]]) -> float:
        """Warmup: every prepared shape compiled once; returns the predicted seconds."""
        for pairs in phases.values():
            for prefill, decode in pairs:
                self.compiled.update(step_graphs(prefill, decode, self.step_recipes))
        return self.cost.warmup_time(len(self.compiled))

    def forward(self, meta: ForwardMeta, attention: Any = None) -> None:
        seconds, compiles = self._compile_and_time(meta.shape)
        self.clock.advance(seconds)
        if self.recorded is not None:
            self.recorded.append((self.cost.amounts(meta.shape), compiles))

    def _compile_and_time(self, shape: StepShape) -> tuple[float, int]:
        """A step's seconds (the engine's host time with them), the graphs it is the first
        to use compiled in them, and how many those are (compiled from now on)."""
        seconds, compiles = self._device_time(shape)
        if self._no_host:
            return seconds, compiles
        return seconds + self.host.seconds(step_rows(shape)), compiles

    def _device_time(self, shape: StepShape) -> tuple[float, int]:
        """_compile_and_time's seconds on the device alone."""
        compiled, prefill, decode = self.compiled, shape.prefill, shape.decode
        whole = self.step_recipes and prefill is not None and decode is not None
        # The common step: its graphs were compiled before (asked without listing them).
        if not whole and (
            (prefill is None or ("prefill", prefill) in compiled)
            and (decode is None or ("decode", decode) in compiled)
        ):
            return self._step_time(shape), 0
        new = [g for g in step_graphs(prefill, decode, whole) if g not in compiled]
        if not new:
            return self._step_time(shape), 0
        compiled.update(new)
        self.recompiles += len(new)
        return self._step_time(shape) + len(new) * self.hardware.recompile_s, len(new)

    def steps_before(self, until: float, most: int) -> int:
        """At most how many steps of a run, up to `most`, start before `until`: the first
        now in any case (a head step's time may be anything), then decode steps, none of
        which takes less than the least a decode step can (CostModel.least_decode_seconds):
        so none after the first 2 + window / least."""
        window = until - self.clock()
        least = self.cost.least_decode_seconds()
        if window >= most * least:  # (and a window without end)
            return most
        return min(most, 2 + int(window / least))

    def run_decodes(self, run: DecodeRun, until: float) -> list[float]:
        """Runs the run's first steps on the clock, as forward would one by one: those that
        start before `until` (the next arrival; the first starts now in any case). Returns
        their end times; a graph first used on the way compiles then. Not while recording."""
        if self.recorded is not None:
            raise RuntimeError("a recording device runs every step through forward")
        assert run.widths is not None and run.padded_rows is not None, "pad the run first"
        # A head step runs first in any case, as forward would run it.
        first = 0 if run.head is None else 1
        head_s = 0.0 if run.head is None else self._compile_and_time(run.head.shape)[0]
        # Each stretch of decode-only steps with one bucket runs one graph. (The widths may
        # grow and shrink back as rows leave: every step is compared with the one before.)
        rows, widths = run.padded_rows, run.widths
        if run.steps == first:
            starts = []
        elif not run.leaving and rows[first] == rows[-1] and widths[first] == widths[-1]:
            starts = [first]  # the common run: no row leaves, widths never shrink: one bucket
        else:
            rows, widths = rows[first:], widths[first:]
            changes = (rows[1:] != rows[:-1]) | (widths[1:] != widths[:-1])
            starts = [first, *(changes.nonzero()[0] + 1 + first).tolist()]
        shapes = [(int(run.padded_rows[i]), int(run.widths[i])) for i in starts]
        times = self._decode_times(run, shapes, starts)
        if first:
            times[0] = head_s
        new: dict[tuple[int, int], int] = {}  # each graph not compiled yet: its first step
        for shape, i in zip(shapes, starts, strict=True):
            if ("decode", shape) not in self.compiled and shape not in new:
                new[shape] = i
                times[i] += self.hardware.recompile_s
        # The end times: the clock's time and the steps' summed up in order, as forward's
        # advances would.
        times[0] += self.clock()
        ends = times.cumsum()
        steps = 1 + int(ends[:-1].searchsorted(until))
        compiled = [("decode", shape) for shape, i in new.items() if i < steps]
        self.compiled.update(compiled)
        self.recompiles += len(compiled)
        self.clock.advance_to(float(ends[steps - 1]))
        return ends[:steps].tolist()

    def _decode_times(
        self, run: DecodeRun, shapes: list[tuple[int, int]], starts: list[int]
    ) -> np.ndarray:
        """[steps] each decode step's seconds, compiles left out: a padding device's by its
        bucket alone (`shapes`, each from its step in `starts` on), another's by its rows'
        lengths; the engine's host time by its rows."""
        rows = run.batch if run.leaving else run.rows
        if not self.hardware.pads_to_buckets:
            times = self.cost.decode_seconds(rows, run.slots(), run.blocks)
        else:
            bs = run.block_size
            per_shape = [self._step_time(StepShape(bs, None, shape)) for shape in shapes]
            counts = np.diff([*starts, run.steps]).tolist()
            if run.head is not None:  # the head step's time is its own (run_decodes')
                per_shape, counts = [0.0, *per_shape], [1, *counts]
            times = np.repeat(per_shape, counts)
        return times if self._no_host else times + self.host.seconds(rows)

    def _step_time(self, shape: Any) -> float:
        price = self.cost.step_time if self.speculative is None else self.speculative.step_time
        if not self.hardware.pads_to_buckets:
            return price(shape)
        key = (shape.prefill, shape.decode)
        if key not in self._times:
            self._times[key] = price(shape)
        return self._times[key]


class NoAttention:
    """A simulated run keeps no keys or values: the KV-cache manager's books are enough.
    The simulated device runs no layer, so it is no LayerAttention: nothing asks it for a
    layer's attention."""

    supports_prefix_caching = True
    packs_rows = False

    def load_weights(self, model: Any) -> None:
        """There are no weights."""

    def release(self, request: Request) -> None:
        """Nothing is held."""


class WorkloadLengthSampler:
    """Every request gets as many tokens as it asks for: one fixed token that ends nothing.
    A simulated model computes no logits: a request for log-probabilities is refused, not
    answered with values that were never computed."""

    def __init__(self, token: int = 0) -> None:
        self.token = token

    def validate_request(self, request: Request) -> str | None:
        s = request.sampling
        if s.logprobs is not None or s.prompt_logprobs is not None:
            return (
                "logprobs: a simulated model computes no logits, so it has no "
                "log-probabilities: leave logprobs out, or serve a real model"
            )
        return None

    def sample(self, logits: Any, requests: Sequence[Request]) -> Samples:
        return Samples(np.full(len(requests), self.token, dtype=np.int64))


def pick_token(eos_ids: Iterable[int], vocab_size: int) -> int:
    """A token id that is no end-of-sequence id."""
    eos = set(eos_ids)
    return next(i for i in range(vocab_size) if i not in eos)
