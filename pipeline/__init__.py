"""The engine: entry point, step loop, run artefacts, sweeps and reviews."""

import os
import warnings
from pathlib import Path

# Paddle warns at import that it found no compiler cache; nothing here compiles extensions.
warnings.filterwarnings("ignore", message="No ccache found")


def _prefer_avx2_on_amd() -> None:
    """Paddle's bundled MKL takes a generic, slow code path on AMD CPUs unless told to use
    AVX2, which makes fp32 matmuls several times faster. It must be set before Paddle loads
    MKL, and a value the user set wins. Intel CPUs keep MKL's own choice (AVX-512 where present)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "AuthenticAMD" in cpuinfo.read_text(errors="ignore")[:4096]:
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")


_prefer_avx2_on_amd()
