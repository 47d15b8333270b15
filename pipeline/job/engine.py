"""The step loop: schedule, build metadata, run the model, sample, update."""

from __future__ import annotations

import gc
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog

from pipeline.config.checks import ConfigError
from pipeline.job.clock import Clock, WallClock
from pipeline.job.stop_hook import NeverStop, StopHook
from pipeline.run_folder.records import StepRecord
from stages.forward.forward_meta import ForwardMeta
from stages.interfaces import (
    Attention,
    MetadataBuilder,
    Model,
    Sampler,
    Scheduler,
    Simulation,
    Tokenizer,
)
from stages.sampling.logprobs import score_prompts
from stages.scheduling.request import DecodeRun, Request, StepPlan

log = structlog.get_logger(__name__)


@contextmanager
def long_lived_frozen() -> Iterator[None]:
    """The objects made so far (the requests, with the token lists they grow) left out of
    the collector's full passes while serving, and those passes made ten times rarer: each
    would visit every token of every request and step record again, seconds on a trace of
    millions of tokens. Young garbage is collected as usual."""
    young, middle, full = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, middle, 10 * full)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)
        gc.unfreeze()


class Slots:
    """Closed-loop load, as `vllm bench serve --max-concurrency`: at most `limit` requests
    in flight; a finished request's slot lets the next waiting one in. A request held back
    is sent when the earliest free slot opened, never before its own arrival, and its
    latencies count from then, as a benchmark client measures them. limit 0: open loop."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._opened: deque[float] = deque([0.0] * limit)  # when each free slot opened

    @property
    def free(self) -> bool:
        return not self.limit or bool(self._opened)

    @property
    def next_open(self) -> float:
        """When the slot the next request takes opened (0: open loop; inf: none free)."""
        if not self.limit:
            return 0.0
        return self._opened[0] if self._opened else math.inf

    def take(self, request: Request) -> Request:
        if self.limit:
            request.arrival_s = max(request.arrival_s, self._opened.popleft())
        return request

    def give_back(self, finished_s: float) -> None:
        if self.limit:
            self._opened.append(finished_s)


@dataclass
class Arrivals:
    """What a request source hands the engine between two steps."""

    new: list[Request]
    # Requests to end now, each with its reason (its client left, the server stops): none
    # from a workload (no new list before every step).
    aborted: Sequence[tuple[Request, str]] = ()


class RequestSource(Protocol):
    """Where the engine's requests come from: a workload's arrival times, or a server."""

    def take(self, now: float, idle: bool) -> Arrivals | None:
        """The requests that arrived by `now` and those to abort. When the engine is idle
        (nothing to run), waits for the next one first. None: no request will come again."""


class ArrivalTimes:
    """A workload's requests, each handed in once the run's clock reaches its arrival and,
    under closed-loop load, a slot is free (`finished` gives a request's slot back)."""

    def __init__(self, requests: Sequence[Request], clock: Clock, concurrency: int = 0) -> None:
        self.pending = deque(sorted(requests, key=lambda r: r.arrival_s))
        self.clock = clock
        self.slots = Slots(concurrency)

    def finished(self, request: Request) -> None:
        self.slots.give_back(request.finish_s if request.finish_s is not None else self.clock())

    def take(self, now: float, idle: bool) -> Arrivals | None:
        pending = self.pending
        if idle:
            if not pending:
                return None
            self.clock.sleep_until(pending[0].arrival_s)  # idle until the next arrival
            now = self.clock()
        new, slots = [], self.slots
        while pending and pending[0].arrival_s <= now and slots.free:
            new.append(slots.take(pending.popleft()))
        return Arrivals(new)


@dataclass
class Outlets:
    """Where the loop hands on what each step gives: its record, its sampled requests (their
    new tokens), and the requests that ended."""

    on_step: Callable[[StepRecord], None]
    on_tokens: Callable[[list[Request]], None]
    on_finish: Callable[[Request], None]


class Advance(Protocol):
    """How the loop gets on once requests are in: one step (Engine.step), or more at once
    where the device predicts its steps (pipeline.executors.fast_forward). Returns the
    steps recorded or done; `fresh`: requests were just handed in."""

    def __call__(self, index: int, outlets: Outlets, fresh: bool) -> int: ...


class FastForwardMaker(Protocol):
    """What makes a run's Advance doing runs of decode steps at once, each handed to
    `on_run` in place of its steps' records, between a workload's arrivals and `stop`'s
    changes (the simulated executor's)."""

    def __call__(
        self,
        engine: Engine[Any],
        arrivals: ArrivalTimes,
        stop: StopHook,
        on_run: Callable[[DecodeRun], None],
    ) -> Advance: ...


# The engine's attention stage: the one its model's forward takes.
A = TypeVar("A", bound=Attention)


class Engine(Generic[A]):
    def __init__(
        self,
        tokenizer: Tokenizer,
        scheduler: Scheduler,
        metadata: MetadataBuilder,
        model: Model[A],
        attention: A,
        sampler: Sampler,
        clock: Clock | None = None,
        workload_counts: Mapping[str, Any] | None = None,
        record_lengths: bool = True,
        concurrency: int = 0,
        simulation: Simulation | None = None,
        fast_forward: FastForwardMaker | None = None,
    ) -> None:
        """clock: the run's time, by default the wall's; a simulated device's is virtual.
        workload_counts: what the workload counted as it loaded (a trace's skipped,
        clipped and rejected rows), for the run's metrics. record_lengths: whether step
        records list each decode row's length (what calibration fits real steps by).
        concurrency: closed-loop load, at most this many requests in flight (0 = open
        loop, every request enters at its arrival). simulation: where the model is a simulated
        device, what it adds (predicted warmup, runs of decode steps, its metrics), and
        fast_forward what makes the loop do such runs at once."""
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.metadata = metadata
        self.model = model
        self.attention = attention
        self.sampler = sampler
        self.clock = clock or WallClock()
        self.workload_counts = workload_counts or {}
        self.record_lengths = record_lengths
        self.concurrency = concurrency
        self.simulation = simulation
        self.fast_forward = fast_forward
        self.warmed_shapes = 0  # shapes the last warmup prepared

    def _run(self, plan: StepPlan, meta: ForwardMeta) -> list[Request]:
        """The scheduled step, laid out in `meta`, through the model, sampler and update;
        returns the requests that stopped after its samples."""
        logits = self.model.forward(meta, self.attention)
        if meta.prompt_spans:  # prompt log-probabilities asked: their rows end the logits
            logits = score_prompts(logits, meta.prompt_spans)
        samples = self.sampler.sample(logits, plan.sampled_requests)
        return self.scheduler.update(plan, samples, self.clock())

    def now(self) -> float:
        """The run's clock: the wall's, or a simulated device's."""
        return self.clock()

    def warmup(self) -> float:
        """Runs every prepared bucket shape once, as the HPU compiles them before serving."""
        start = time.perf_counter()
        simulation = self.simulation
        # A simulated device predicts the compile time of any set, however large.
        self.check_warmup_budget(enforce=simulation is None)
        phases = self.warmup_shapes()
        self.warmed_shapes = sum(len(shapes) for shapes in phases.values())
        if simulation is not None:
            return simulation.predict_warmup(phases)
        for phase, shapes in phases.items():
            t = time.perf_counter()
            for prefill, decode in shapes:
                self.model.forward(self.metadata.dummy(prefill, decode), self.attention)
            log.info(
                "warmup_phase",
                phase=phase,
                shapes=len(shapes),
                seconds=round(time.perf_counter() - t, 3),
            )
        return time.perf_counter() - start

    def warmup_shapes(self) -> dict[str, list[tuple]]:
        """The bucket pairs warmup runs: what this scheduler's steps can pad to."""
        return self.metadata.warmup_shapes(
            mixed=self.scheduler.splits_prompts, padded_budget=self.scheduler.padded_budget
        )

    def warmup_counts(self) -> dict[str, int]:
        """The graphs each warmup phase compiles (their sum: metrics' warmup_shapes)."""
        return self.metadata.warmup_counts(
            mixed=self.scheduler.splits_prompts, padded_budget=self.scheduler.padded_budget
        )

    def check_warmup_budget(self, enforce: bool = True) -> None:
        """Logs how many shapes each warmup phase compiles; a set beyond
        metadata.max_warmup_shapes stops the run before compiling any (when enforced)."""
        counts = self.warmup_counts()
        total = sum(counts.values())
        log.info("warmup_plan", total=total, **counts)
        limit = self.metadata.max_warmup_shapes
        if enforce and limit and total > limit:
            phases = ", ".join(f"{phase} {n:,}" for phase, n in counts.items())
            raise ConfigError(
                f"warmup would compile {total:,} shapes ({phases}), more than "
                f"metadata.max_warmup_shapes={limit}: set metadata.bucketing=exponential, "
                "coarser metadata.<axis>.step, or a planned set with metadata.<axis>.sizes "
                "(python -m pipeline.buckets plan RUN), or raise metadata.max_warmup_shapes"
            )

    def rejection(self, request: Request) -> str | None:
        """Why the request can never be served here (its length or its sampling values)."""
        return self.scheduler.rejection(request) or self.sampler.validate_request(request)

    def reject_invalid(self, requests: Sequence[Request]) -> None:
        """A request that can never be served ends now with its reason; the others go on."""
        for r in requests:
            if not r.finished:
                reason = self.rejection(r)
                if reason:
                    r.fail(reason, r.arrival_s)

    def run(
        self,
        requests: Sequence[Request],
        on_step: Callable[[StepRecord], None] = lambda record: None,
        on_finish: Callable[[Request], None] = lambda request: None,
        on_run: Callable[[DecodeRun], None] | None = None,
        stop: StopHook | None = None,
    ) -> float:
        """Serves every request to its end, or until `stop` says the outcome is decided;
        returns the run's time in seconds. on_run: where the device predicts steps (a
        simulated one) and the caller keeps no step records, runs of decode steps are done
        at once, each handed to on_run instead of its steps' records (metrics equal a
        step-by-step run's)."""
        clock = self.clock
        clock.restart()
        self.reject_invalid(requests)
        for r in requests:
            if r.finished:
                on_finish(r)
        arrivals = ArrivalTimes([r for r in requests if not r.finished], clock, self.concurrency)

        def finished(request: Request) -> None:
            arrivals.finished(request)
            on_finish(request)

        stop = stop or NeverStop()
        advance = None
        if on_run is not None and self.fast_forward is not None:
            advance = self.fast_forward(self, arrivals, stop, on_run)
        with long_lived_frozen():
            return self.loop(arrivals, on_step, finished, stop=stop, advance=advance)

    def loop(
        self,
        source: RequestSource,
        on_step: Callable[[StepRecord], None] = lambda record: None,
        on_finish: Callable[[Request], None] = lambda request: None,
        on_tokens: Callable[[list[Request]], None] = lambda requests: None,
        stop: StopHook | None = None,
        advance: Advance | None = None,
    ) -> float:
        """Serves what the source hands in until it has no more, or until `stop` says so;
        returns the clock's time. Each request the source gives must have passed
        `rejection`. on_tokens gets each step's sampled requests (their new tokens) before
        on_finish gets those that ended. advance: how the loop gets on (by default one
        step at a time); `stop` is asked between its turns."""
        clock, scheduler = self.clock, self.scheduler
        stop = stop or NeverStop()
        advance = advance or self.step
        outlets = Outlets(on_step, on_tokens, on_finish)
        index = 0
        while (
            not stop(now := clock())
            and (arrivals := source.take(now, idle=not scheduler.has_work)) is not None
        ):
            self._admit(arrivals, on_finish)
            if scheduler.has_work:
                index += advance(index, outlets, fresh=bool(arrivals.new))
        return clock()

    def _admit(self, arrivals: Arrivals, on_finish: Callable[[Request], None]) -> None:
        """The scheduler takes the new requests; the aborted ones end now."""
        for r in arrivals.new:
            self.scheduler.add(r)
        for r, reason in arrivals.aborted:
            if not r.finished:
                self.scheduler.abort(r, reason, self.clock())
                self.release([r], on_finish)

    def step(self, index: int, outlets: Outlets, fresh: bool = False) -> int:
        """Runs one step (step `index`) and hands on its tokens, its ended requests and its
        record; returns the steps recorded: 0 where the plan only failed requests."""
        t = self.clock()
        planned = self.schedule_step(t, outlets)
        return 0 if planned is None else self.run_step(index, *planned, t, outlets)

    def schedule_step(self, t: float, outlets: Outlets) -> tuple[StepPlan, ForwardMeta] | None:
        """The next step scheduled at `t` and laid out; None where its plan only failed
        requests (they are handed on)."""
        plan = self.scheduler.schedule(t)
        if plan.empty:
            outlets.on_tokens([])
            self.release(plan.failed, outlets.on_finish)
            if plan.failed:
                return None
            raise RuntimeError("the scheduler found nothing to run while requests wait")
        return plan, self.metadata.build(plan)

    def run_step(
        self, index: int, plan: StepPlan, meta: ForwardMeta, t: float, outlets: Outlets
    ) -> int:
        """The scheduled step (at `t`) through the model, sampler and update; hands on its
        tokens, its ended requests and its record (step `index`). Returns 1."""
        finished = self._run(plan, meta)
        outlets.on_tokens(plan.sampled_requests)
        self.release(plan.failed + finished, outlets.on_finish)
        duration = self.clock() - t
        outlets.on_step(StepRecord.of(index, plan, meta, duration, self.record_lengths))
        return 1

    def release(self, requests: list[Request], on_finish: Callable[[Request], None]) -> None:
        """Ended requests give their cache back, then are handed on."""
        for r in requests:
            self.attention.release(r)
            on_finish(r)
