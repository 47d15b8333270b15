"""Stopping a run early: by a signal, SIGINT (Ctrl-C) and SIGTERM (what `timeout`,
schedulers and `kill` send) both ending the run the same way, with the folder written and the
exit code the shell expects (128 + the signal's number: 130 and 143); or by a stop hook the
caller hands the engine, once the run's outcome is decided (a capacity probe's SLO verdict).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


class RunInterrupted(BaseException):
    """A stop signal arrived. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on the way (Hydra's job runner, a sweep's launcher) swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.recorded = False  # True once the run folder says `status: interrupted`

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block the first stop signal raises RunInterrupted; later ones are ignored,
    so that the folder is written whole however often Ctrl-C is pressed."""
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise RunInterrupted(signum)

    previous = {}
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread (a threaded launcher): the defaults stay
        pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def as_interrupted(err: BaseException) -> RunInterrupted:
    """KeyboardInterrupt (raised where no handler could be installed) as RunInterrupted."""
    return err if isinstance(err, RunInterrupted) else RunInterrupted(signal.SIGINT)
