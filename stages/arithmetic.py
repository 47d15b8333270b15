"""Integer arithmetic every stage shares."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

IntOrArray = TypeVar("IntOrArray", int, np.ndarray)


def ceil_div(a: IntOrArray, b: int) -> IntOrArray:
    """a / b rounded up, for whole numbers (each of an array's) and b >= 1: (a + b - 1) // b,
    two operations on an array where -(-a // b) takes three."""
    return (a + (b - 1)) // b
