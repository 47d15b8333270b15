"""The engine, grouped by job (job, run_folder, config, disagg, ...); each command (`python -m
pipeline.NAME`) is a package of its own here (docs/architecture.md, "Where the code lives")."""

import os
import warnings
from pathlib import Path

# Paddle warns at import that it found no compiler cache; nothing here compiles extensions.
warnings.filterwarnings("ignore", message="No ccache found")


# The AVX-512 subsets MKL's AVX-512 code path executes.
_MKL_AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def mkl_cpu_type(cpuinfo: str) -> str | None:
    """The MKL_DEBUG_CPU_TYPE for a CPU, from /proc/cpuinfo's text; None = MKL's own choice.

    Paddle's bundled MKL takes a generic, slow code path on AMD CPUs unless told which one
    to use: AVX2 (5) makes fp32 matmuls several times faster, and AVX-512 (6), where the CPU
    has every subset that path executes, runs the decode attention's small per-block value
    products in a fifth to two fifths less time at the same dense matmul rate
    (benchmarks/peer.md). A CPU without those subsets must not get 6: MKL would execute
    instructions it lacks. Intel CPUs keep MKL's own choice."""
    if "AuthenticAMD" not in cpuinfo:
        return None
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return "6" if _MKL_AVX512_FLAGS <= set(flags.partition(":")[2].split()) else "5"


def _choose_mkl_path() -> None:
    """Set before Paddle loads MKL; a value the user set wins."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return
    cpu_type = mkl_cpu_type(cpuinfo.read_text(errors="ignore"))
    if cpu_type is not None:
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", cpu_type)


_choose_mkl_path()


def _quiet_thread_warning() -> None:
    """Paddle prints "PLEASE USE OMP_NUM_THREADS WISELY" at import for any OMP_NUM_THREADS
    above 1 (a warning for data-parallel training). The engine sets its math threads
    itself (`num_threads`, after import), so Paddle is imported with the variable at 1 and
    a user's exported value neither warns nor changes the threads."""
    if os.environ.get("OMP_NUM_THREADS", "1").strip() != "1":
        os.environ["OMP_NUM_THREADS"] = "1"


_quiet_thread_warning()
