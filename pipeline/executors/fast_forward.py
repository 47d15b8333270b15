"""Fast-forward, the simulated executor's: where its device predicts each step's time and
the caller keeps no step records, runs of decode steps are done at once (leaps) wherever
nothing else can happen between them: no request arrives, the stop hook's answer cannot
change, and only the rows' length limits end them. A leap gives exactly what its steps one
by one give (tests/test_leaps.py): the simulation plans it from the scheduler's table
(stages.simulator.fast_forward), the device puts its steps on the clock and the scheduler
applies it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pipeline.job.engine import ArrivalTimes, Engine, Outlets
from pipeline.job.stop_hook import StopHook
from stages.scheduling.request import DecodeRun, Request


class FastForward:
    """The loop's advance (pipeline.job.engine.Advance) with leaps: `until` gives when the
    source may next hand in a request or the stop hook's answer change, `finishes` how
    many requests may finish before either changes, and `on_run` takes each leap in place
    of its steps' records."""

    def __init__(
        self,
        engine: Engine[Any],
        until: Callable[[], float],
        finishes: Callable[[], float],
        on_run: Callable[[DecodeRun], None],
    ) -> None:
        if engine.simulation is None:
            raise ValueError("only a simulated device does runs of decode steps at once")
        self.engine, self.simulation = engine, engine.simulation
        self.until, self.finishes, self.on_run = until, finishes, on_run

    def __call__(self, index: int, outlets: Outlets, fresh: bool) -> int:
        """A leap where the next steps can only decode; else the next step, which may head
        a leap where it admits requests that each prefill their whole prompt (requests
        just handed in are what it admits). Returns the steps done. The step's scheduling
        changes neither `until` nor `finishes` (the requests it fails are handed on after)."""
        engine, finishes = self.engine, self.finishes()
        if not fresh and (leapt := self.simulation.leap(self.until, finishes)):
            return self._hand_on(*leapt, outlets)
        t = engine.clock()
        planned = engine.schedule_step(t, outlets)
        if planned is None:
            return 0
        if leapt := self.simulation.leap(self.until, finishes, planned):
            return self._hand_on(*leapt, outlets)
        return engine.run_step(index, *planned, t, outlets)

    def _hand_on(self, run: DecodeRun, finished: list[Request], outlets: Outlets) -> int:
        """Hands on a leap's tokens, its run and its ended requests; returns its steps."""
        outlets.on_tokens(run.requests)
        self.on_run(run)
        self.engine.release(finished, outlets.on_finish)
        return run.steps


def workload_fast_forward(
    engine: Engine[Any],
    arrivals: ArrivalTimes,
    stop: StopHook,
    on_run: Callable[[DecodeRun], None],
) -> FastForward:
    """Leaps between a workload's arrivals and the stop hook's changes (Engine.run's)."""

    def until() -> float:
        """The earliest time the workload hands in another request while none finishes
        (never while closed-loop load has every slot taken), or the hook may change."""
        pending = arrivals.pending
        arrival = pending[0].arrival_s if pending and arrivals.slots.free else math.inf
        return min(arrival, stop.next_change())

    def finishes() -> float:
        """How many requests may finish first: none while closed-loop load holds one back
        (a finish frees its slot), else as many as the stop hook lets."""
        held_back = 0 if arrivals.pending and not arrivals.slots.free else math.inf
        return min(held_back, stop.finishes_before_change())

    return FastForward(engine, until, finishes, on_run)
