"""Process-level tuning of the CPU allocator that Paddle's kernels run on."""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _libc_function(symbol: str) -> Callable[..., int] | None:
    """The C library's function `symbol`, or None where it has none (not glibc)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)[symbol]
    except (OSError, AttributeError):
        return None


def keep_freed_memory(threshold_bytes: int = 1 << 30) -> bool:
    """Stops glibc from returning multi-megabyte tensors to the kernel on every free.

    By default each large step tensor is a fresh mmap, and touching its pages costs more
    than the op itself (benchmarks/results.md, "Design measurements"). Returns False where
    the C library has no mallopt (not glibc)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, threshold_bytes)
    )


class HeapTrimmer:
    """Hands the heap's free pages back to the kernel (glibc's malloc_trim) at most every
    `every_s` seconds (0: never), for a process that runs for days. With freed memory kept
    (keep_freed_memory), the arenas grow in steps as they fragment while the bytes in use
    stay flat; a trim a minute gives those pages back at the cost of faulting some in
    again (docs/serving.md, "Memory over a long run")."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._trim = _libc_function("malloc_trim") if every_s > 0 else None
        self._last = time.monotonic()
        self.trims = 0

    def maybe_trim(self) -> None:
        if self._trim is None or time.monotonic() - self._last < self.every_s:
            return
        self._trim(0)
        self._last = time.monotonic()
        self.trims += 1
