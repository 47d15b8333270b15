"""Int8 weight-only storage (`model.weights=int8`): a projection's weights as int8 rows with
one float32 scale per output, multiplied by a small Paddle custom operator.

A decode step of a small model reads every weight once and does little else with it, so its
time follows the weights' bytes: int8 reads a quarter of float32's. Paddle's CPU matmul
takes float32 only (its bf16 and int8 kernels are oneDNN's, for static programs), so
the multiply is int8_matmul.cc, compiled by Paddle's cpp_extension at first use (for the
machine it runs on, cached after), on `threads` threads (TransformerLM.use_threads). It
rounds each input row to 16-bit levels (2 * 32767 steps across the row's largest
magnitude, fewer for rows longer than 8192) and sums the products in integers with
AVX512-VNNI where the machine has it: an input moves by at most 1 / 65534 of its row's
peak, far below the weights' own rounding to 255 levels per output (the drift against
float32: docs/checkpoints.md). A prefill's rows take the same operator: at 32 to 256
rows it ran as fast as Paddle's float32 matmul on the widened weights, or faster.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import paddle

# The compiled operators: the int8 matmul, the norms that run beside it, and a decode
# step's whole layer.
SOURCES = [Path(__file__).with_name(name) for name in ("int8_matmul.cc", "decode_layer.cc")]
HEADERS = [Path(__file__).with_name("int8_gemm.h")]
# Rows rounded at a time: the rounding's float32 temporaries stay a few MiB.
ROUNDING_ROWS = 2048
# Built on the machine that runs it, for its own instruction set; OpenMP for its threads,
# from the runtime Paddle's MKL runs on (Intel's, shipped with Paddle) where there is one:
# two runtimes would each keep their threads spinning on the same cores.
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp"]
PADDLE_LIBS = Path(paddle.__file__).parent / "libs"
LINK_FLAGS = (
    [f"-L{PADDLE_LIBS}", "-liomp5", f"-Wl,-rpath,{PADDLE_LIBS}"]
    if (PADDLE_LIBS / "libiomp5.so").exists()
    else ["-fopenmp"]
)


class KernelBuildError(ValueError):
    """The int8 operator could not be compiled or loaded (no C++ compiler, say): a
    ValueError, so that building the model turns it into a one-line config error."""


@functools.cache
def kernel() -> Any:
    """The compiled operator module: built once per source text and flags (its name holds
    their hash), imported straight from the built library after that (a rebuild check
    alone starts a Python with Paddle, seconds a process)."""
    from paddle.utils.cpp_extension import get_build_directory, load
    from paddle.utils.cpp_extension.extension_utils import _import_module_from_library

    text = b"".join(source.read_bytes() for source in SOURCES + HEADERS)
    digest = hashlib.sha256(text + " ".join(CXX_FLAGS + LINK_FLAGS).encode()).hexdigest()
    name = f"int8_matmul_{digest[:12]}"
    built = Path(get_build_directory()) / name
    try:
        if (built / f"{name}.so").exists():
            return _import_module_from_library(name, str(built))
        return load(
            name=name,
            sources=[str(source) for source in SOURCES],
            extra_cxx_cflags=CXX_FLAGS,
            extra_ldflags=LINK_FLAGS,
        )
    except Exception as err:  # cpp_extension raises whatever the compiler or loader gave
        raise KernelBuildError(
            f"model.weights=int8 needs a C++ compiler to build {SOURCES[0].name} ({err}); "
            "use model.weights=float32"
        ) from err


@dataclass
class Int8Weight:
    """A weight [in, out] as int8 rows [out, in] and float32 scales [out]: output j's
    weights are rows[j] * scales[j]."""

    rows: paddle.Tensor  # int8 [out, in]
    scales: paddle.Tensor  # float32 [out]
    threads: int = 1  # the operator's threads: the run's num_threads

    @classmethod
    def of_rows(cls, rows: paddle.Tensor | np.ndarray) -> Int8Weight:
        """Rows [out, in] (a tied embedding is already one row a token), rounded to the
        nearest of 255 levels spanning each row's largest magnitude; a block of rows at a
        time, so that rounding a large table holds no float32 copy of it."""
        values = rows if isinstance(rows, np.ndarray) else rows.numpy()
        levels = np.empty(values.shape, dtype=np.int8)
        scales = np.empty(values.shape[0], dtype=np.float32)
        for first in range(0, values.shape[0], ROUNDING_ROWS):
            block = values[first : first + ROUNDING_ROWS].astype(np.float32)
            peak = np.abs(block).max(axis=1)
            scale = np.where(peak > 0, peak / np.float32(127), np.float32(1))
            levels[first : first + ROUNDING_ROWS] = np.clip(
                np.rint(block / scale[:, None]), -127, 127
            )
            scales[first : first + ROUNDING_ROWS] = scale
        return cls(paddle.to_tensor(levels), paddle.to_tensor(scales))

    @classmethod
    def of_matrix(cls, weight: paddle.Tensor | np.ndarray) -> Int8Weight:
        """A matmul weight [in, out]."""
        if isinstance(weight, np.ndarray):
            return cls.of_rows(weight.T)  # a view: of_rows copies a block of rows at a time
        return cls.of_rows(weight.T.contiguous())

    def outputs(self, index: paddle.Tensor) -> Int8Weight:
        """The weight of outputs `index` only, in that order (a reordered QKV)."""
        rows, scales = paddle.gather(self.rows, index), paddle.gather(self.scales, index)
        return Int8Weight(rows, scales, self.threads)

    def widened(self) -> paddle.Tensor:
        """The float32 rows [out, in] the int8 levels stand for."""
        return self.rows.astype("float32") * self.scales.unsqueeze(1)

    def row_values(self, ids: paddle.Tensor) -> paddle.Tensor:
        """Rows `ids` in float32: an embedding lookup."""
        picked = paddle.gather(self.rows, ids).astype("float32")
        return picked * paddle.gather(self.scales, ids).unsqueeze(1)

    def matmul(self, x: paddle.Tensor) -> paddle.Tensor:
        """x [n, in] @ the weight -> [n, out], float32."""
        return kernel().int8_matmul(x, self.rows, self.scales, self.threads)


Weight: TypeAlias = paddle.Tensor | Int8Weight


def dense(weight: Weight) -> paddle.Tensor:
    """The weight [in, out] as a tensor, int8 widened to float32."""
    return weight.widened().T if isinstance(weight, Int8Weight) else weight


def project(x: paddle.Tensor, weight: Weight) -> paddle.Tensor:
    """x @ weight, whichever way the weight is stored."""
    if isinstance(weight, Int8Weight):
        return weight.matmul(x)
    return paddle.matmul(x, weight)
