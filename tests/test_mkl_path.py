"""Which MKL code path the engine asks for, from hand-made /proc/cpuinfo texts."""

from __future__ import annotations

import pytest

from pipeline import mkl_cpu_type

AVX2 = "fpu sse sse2 avx avx2 fma bmi2"
AVX512 = AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16"


def cpuinfo(vendor: str, flags: str) -> str:
    return (
        f"processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: some CPU\nflags\t\t: {flags}\n\n"
        f"processor\t: 1\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n"
    )


def test_amd_with_every_avx512_subset_gets_the_avx512_path() -> None:
    assert mkl_cpu_type(cpuinfo("AuthenticAMD", AVX512)) == "6"


@pytest.mark.parametrize("missing", ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"])
def test_amd_missing_one_avx512_subset_gets_avx2(missing: str) -> None:
    flags = " ".join(f for f in AVX512.split() if f != missing)
    assert mkl_cpu_type(cpuinfo("AuthenticAMD", flags)) == "5"


def test_amd_without_avx512_gets_avx2() -> None:
    assert mkl_cpu_type(cpuinfo("AuthenticAMD", AVX2)) == "5"


def test_a_flag_name_inside_another_does_not_count() -> None:
    # "avx512f" must be a flag of its own, not a prefix of "avx512fp16" or the like.
    flags = AVX2 + " avx512fp16 avx512dq avx512cd avx512bw avx512vl"
    assert mkl_cpu_type(cpuinfo("AuthenticAMD", flags)) == "5"


@pytest.mark.parametrize("flags", [AVX2, AVX512])
def test_intel_keeps_mkls_own_choice(flags: str) -> None:
    assert mkl_cpu_type(cpuinfo("GenuineIntel", flags)) is None


def test_no_flags_line_gets_avx2_on_amd() -> None:
    assert mkl_cpu_type("vendor_id\t: AuthenticAMD\n") == "5"
