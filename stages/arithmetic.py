"""Integer arithmetic every stage shares."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

IntOrArray = TypeVar("IntOrArray", int, np.ndarray)


def ceil_div(a: IntOrArray, b: int) -> IntOrArray:
    """a / b rounded up, for whole numbers (each of an array's): -(-a // b)."""
    return -(-a // b)
