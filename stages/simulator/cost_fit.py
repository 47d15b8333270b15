"""Coefficients of the cost model's terms from measured steps: non-negative least squares
on the terms' rooflines (CostModel.fit builds the design; this solves it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from stages.simulator.nnls import nnls


def fit_coefficients(
    coefficients: Mapping[str, float],
    names: Sequence[str],
    a: np.ndarray,
    b: np.ndarray,
    terms: Sequence[str] | None = None,
    relative: bool = False,
) -> dict[str, float]:
    """`coefficients` with those of `terms` (default: all `names`) fitted to the design `a`
    (a row per sample, a column per name: its roofline seconds) and the times `b`; the
    others are held at their values, as is a term no sample exercises. `relative` weighs
    each sample by 1 / its time."""
    names = tuple(names)
    chosen = names if terms is None else tuple(terms)
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise ValueError(f"fit: unknown terms {', '.join(unknown)}; the terms are {names}")
    if relative:
        weight = 1.0 / np.maximum(b, 1e-12)
        a, b = a * weight[:, None], b * weight
    fixed = [j for j, name in enumerate(names) if name not in chosen]
    b = b - a[:, fixed] @ np.array([coefficients[names[j]] for j in fixed])
    used = [j for j in range(len(names)) if names[j] in chosen and a[:, j].any()]
    if not used:
        raise ValueError(f"fit: no sample exercises any of {', '.join(chosen)}")
    if len(a) < len(used):
        raise ValueError(
            f"fit: {len(a)} samples for {len(used)} coefficients; give at least "
            f"{len(used)} steps of varied shapes"
        )
    scale = np.linalg.norm(a[:, used], axis=0)  # unit columns: rooflines span decades
    check_separable(a[:, used] / scale, [names[j] for j in used])
    solution = nnls(a[:, used] / scale, b) / scale
    fitted = dict(coefficients)
    fitted.update({names[j]: float(x) for j, x in zip(used, solution, strict=True)})
    return fitted


def check_separable(a: np.ndarray, names: Sequence[str]) -> None:
    """Refuses samples in which some terms' times move together: their coefficients could
    trade against each other freely (e.g. KV writes and all-reduces both scale with tokens)."""
    _, singular, vt = np.linalg.svd(a, full_matrices=False)
    null = vt[singular < 1e-9 * singular[0]]
    if len(null):
        tied = [
            n for n, weight in zip(names, np.abs(null).max(axis=0), strict=True) if weight > 1e-6
        ]
        raise ValueError(
            f"fit: these samples cannot tell {', '.join(tied)} apart (their times move "
            "together): fit fewer of them (terms=...) or add steps of other shapes"
        )
