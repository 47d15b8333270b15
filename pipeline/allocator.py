"""Process-level tuning of the CPU allocator that Paddle's kernels run on."""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(threshold_bytes: int = 1 << 30) -> bool:
    """Stops glibc from returning multi-megabyte tensors to the kernel on every free.

    By default each large step tensor is a fresh mmap, and touching its pages costs more
    than the op itself (benchmarks/results.md, "Design measurements"). Returns False where
    the C library has no mallopt (not glibc)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, threshold_bytes)
    )
