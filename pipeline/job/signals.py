"""Stopping a run by a signal: SIGINT (Ctrl-C) and SIGTERM (what `timeout`, schedulers and
`kill` send) both end the run the same way, with the folder written and the exit code the
shell expects (128 + the signal's number: 130 and 143). A run that stops itself once its
outcome is decided uses a stop hook instead (pipeline/job/stop_hook.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
