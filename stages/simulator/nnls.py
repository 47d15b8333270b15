"""Non-negative least squares, Lawson and Hanson's active-set method, in numpy."""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 0) -> np.ndarray:
    """x >= 0 minimising ||a x - b||; columns of `a` are best scaled alike beforehand."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = a.shape[1]
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0)) * max(a.shape))
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter or 3 * n + 10):
        gradient = a.T @ (b - a @ x)
        if passive.all() or gradient[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while passive.any():
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > tol:
                x = z
                break
            # Step from x towards z until the first passive coefficient reaches zero.
            falling = passive & (z <= tol)
            alpha = np.min(x[falling] / (x[falling] - z[falling]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x
