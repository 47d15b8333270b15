"""A run's clock: seconds since its start, the wall's by default (a simulated device keeps
a virtual one, stages.simulator.device.VirtualClock)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds since the run's start."""

    def sleep_until(self, t: float) -> None: ...

    def restart(self) -> None: ...


class WallClock:
    """Seconds since the run's start; idling sleeps."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self._start

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self()))

    def restart(self) -> None:
        self._start = time.perf_counter()
