"""Host arrays into Paddle tensors: the same values, shapes and dtypes as the array, and
nothing left behind per tensor (Paddle's constructor keeps a list of its keyword names)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from stages.forward.host_tensor import host_tensor


def live_lists() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is list)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.int64).reshape(3, 4),
        np.linspace(-1, 1, 7, dtype=np.float32),
        np.array([True, False, True]),
        np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not contiguous
        np.zeros((0, 5), np.int64),
        np.array(7, np.int64),
    ],
)
def test_a_tensor_holds_the_arrays_values_shape_and_dtype(array):
    tensor = host_tensor(array)
    assert tensor.numpy().dtype == array.dtype and tensor.shape == list(array.shape)
    np.testing.assert_array_equal(tensor.numpy(), array)


def test_making_tensors_leaves_nothing_behind():
    array = np.arange(64, dtype=np.int64)
    host_tensor(array)
    before = live_lists()
    for _ in range(500):
        host_tensor(array)
    assert live_lists() - before < 10  # paddle.to_tensor: one more list per tensor
