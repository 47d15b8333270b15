"""Handing the C heap's free pages back to the system now and then, on glibc.

A long-serving process keeps allocating and freeing arrays of every size (step metadata,
logits, HTTP bodies); glibc keeps the freed memory in its arenas for reuse, so the
resident size climbs in steps while the memory in use stays flat. `malloc_trim(0)` gives
the free pages back. Measured over a soak: ~20 MiB of a ~650 MiB server was free heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None on another C library."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


class HeapTrimmer:
    """Calls malloc_trim at most every `every_s` seconds (0: never) when asked."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._trim = _malloc_trim() if every_s > 0 else None
        self._last = time.monotonic()
        self.trims = 0

    def maybe_trim(self) -> None:
        if self._trim is None or time.monotonic() - self._last < self.every_s:
            return
        self._trim(0)
        self._last = time.monotonic()
        self.trims += 1
