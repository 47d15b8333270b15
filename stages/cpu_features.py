"""What the host CPU offers, read once from /proc/cpuinfo (empty elsewhere).

Some of Paddle's CPU kernels are built for one instruction set and are not dispatched at
run time: its fused RMSNorm kernel executes AVX-512 instructions and dies with SIGILL on a
CPU without them. Callers ask here before choosing such a kernel."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _cpuinfo_head() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    try:
        # The first processor's block names the vendor and every flag.
        return cpuinfo.read_text(errors="ignore").split("\n\n", 1)[0]
    except OSError:
        return ""


def vendor() -> str:
    """The vendor id, e.g. "GenuineIntel" or "AuthenticAMD"; "" when unknown."""
    for line in _cpuinfo_head().splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return ""


def flags() -> frozenset[str]:
    """The CPU's feature flags (avx2, avx512f, ...); empty when unknown."""
    for line in _cpuinfo_head().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def has_avx512() -> bool:
    """True only where the CPU is known to run AVX-512 foundation instructions."""
    return "avx512f" in flags()
