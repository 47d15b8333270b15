"""What the CPU attention ops share: the score of a key a query must not see, and copies
made dense by Paddle's own kernels rather than left as strided views."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import paddle

_STRIDE_FLAG = "FLAGS_use_stride_kernel"
try:
    _HAS_STRIDE_FLAG = _STRIDE_FLAG in paddle.get_flags([_STRIDE_FLAG])
except ValueError:  # a Paddle without strided views
    _HAS_STRIDE_FLAG = False


@contextlib.contextmanager
def dense_copies() -> Iterator[None]:
    """Transposes and slices made inside are new dense tensors, copied by Paddle's own
    transpose and slice kernels, rather than strided views. A view is copied anyway by the
    next op that needs dense input (a matmul, a reshape), and that copy, Paddle's generic
    strided one, takes several times longer (benchmarks/peer.md). Reshapes of dense
    tensors stay views either way."""
    if not _HAS_STRIDE_FLAG:
        yield
        return
    previous = paddle.get_flags([_STRIDE_FLAG])[_STRIDE_FLAG]
    paddle.set_flags({_STRIDE_FLAG: False})
    try:
        yield
    finally:
        paddle.set_flags({_STRIDE_FLAG: previous})
