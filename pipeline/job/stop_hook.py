"""Stopping a run once its outcome is decided: a hook the caller hands the engine (a capacity
probe's SLO verdict, pipeline/job/slo.py), asked before each step."""

from __future__ import annotations

import math
from typing import Protocol


class StopHook(Protocol):
    """Asked by the engine before each step with the run's clock: True once what follows
    cannot change what the caller wants from the run; the engine then returns, leaving the
    requests still in flight unfinished for the caller to account for."""

    def __call__(self, now: float) -> bool: ...

    def next_change(self) -> float:
        """The earliest time after the last call at which the answer may change while no
        request finishes and none arrives (math.inf: none): a simulated device leaps over
        runs of decode steps no further, so the run stops where step by step it would."""
        ...

    def finishes_before_change(self) -> float:
        """How many more requests may finish, however they fare, before the answer may
        change (math.inf: any number): a leap lets no more rows than that leave its batch
        before its last step."""
        ...


class NeverStop:
    """The default stop hook: the run serves every request."""

    def __call__(self, now: float) -> bool:
        return False

    def next_change(self) -> float:
        return math.inf

    def finishes_before_change(self) -> float:
        return math.inf
