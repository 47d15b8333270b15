"""The routed experts of one MoE layer on one device: which experts a step's tokens touch,
how many token-expert pairs the busiest rank computes, and the grouped GEMM's fixed costs.

- **Experts touched.** With top-k routing over E experts, n tokens touch on average
  E (1 - (1 - k/E)^n) distinct experts (uniform routing: each expert is missed by a token
  with probability 1 - k/E), and each touched expert's weights are read once. Routing that
  favours some experts (`moe_routing_skew` s >= 1) is read as uniform routing over E / s
  experts: fewer distinct experts for the same tokens.
- **The busiest rank.** With the experts split whole over ep ranks (E / ep each), every
  rank waits for the one that touched most experts and got most pairs. Its count is the
  mean plus the expected largest of ep standard normal draws (Blom's approximation) times
  the count's standard deviation, at most all the rank holds: at one token and k = 8 of
  128 experts over 4 ranks a rank holds 2 touched experts on average, the busiest about
  3.2, which is why TP + EP at dp = 1 reads more expert weights than TP alone.
- **Grouped GEMM fixed costs.** A MoE layer's kernels (routing alignment, the grouped gate-up
  and down GEMMs) take a fixed time per layer, `moe_layer_s`, plus a fixed time per expert
  they run, `moe_expert_s`, beside the roofline of their FLOPs and bytes: few tokens per
  expert leave these small GEMMs far below a dense GEMM's efficiency. Both are figures of
  the device profile, fitted to measured kernel times (benchmarks/moe_kernels.py).
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np

from stages.model.spec import MoeLayout


def _plain(value: Any) -> Any:
    """A number as a Python float (numpy's scalars leak into figures that are checked as
    floats), an array as it is."""
    return float(value) if np.ndim(value) == 0 else value


def largest_of_normals(draws: int) -> float:
    """The expected largest of `draws` standard normal values (Blom's approximation,
    exact for one draw: 0)."""
    return NormalDist().inv_cdf((draws - 0.375) / (draws + 0.25))


def check_skew(skew: float, moe: MoeLayout | None) -> None:
    """moe_routing_skew is at least 1 and leaves at least k experts to route to."""
    if not skew >= 1.0:
        raise ValueError(f"moe_routing_skew={skew} must be >= 1 (1: uniform routing)")
    if moe is not None and moe.num_experts / skew < moe.experts_per_token:
        raise ValueError(
            f"moe_routing_skew={skew} leaves fewer than the {moe.experts_per_token} experts "
            f"a token routes to of {moe.num_experts}: at most "
            f"{moe.num_experts / moe.experts_per_token:g}"
        )


def experts_touched(moe: MoeLayout, tokens: Any, skew: float = 1.0) -> Any:
    """Distinct experts `tokens` route to in one layer, expected: uniform routing over
    E / skew experts."""
    pool = moe.num_experts / skew
    missed = (1.0 - moe.experts_per_token / pool) ** np.maximum(tokens, 0)
    return _plain(pool * (1.0 - missed))


def busiest_rank_experts(moe: MoeLayout, tokens: Any, ranks: int, skew: float = 1.0) -> Any:
    """Touched experts on the rank that holds most of them, of its E / ranks: the mean
    share plus the spread of a count of E / ranks experts each touched with the same
    chance (binomial), at most all it holds."""
    touched = experts_touched(moe, tokens, skew)
    if ranks == 1:
        return touched
    held = moe.num_experts / ranks
    chance = touched / moe.num_experts
    spread = np.sqrt(held * chance * (1.0 - chance))
    return _plain(np.minimum(held, touched / ranks + largest_of_normals(ranks) * spread))


def busiest_rank_pairs(moe: MoeLayout, tokens: Any, ranks: int) -> Any:
    """Token-expert pairs the busiest of `ranks` ranks computes in one layer: each token's
    k experts fall on a rank as k draws without replacement from E (hypergeometric)."""
    k, experts = moe.experts_per_token, moe.num_experts
    mean = tokens * k / ranks
    if ranks == 1:
        return mean
    share = 1.0 / ranks
    variance = tokens * k * share * (1 - share) * (experts - k) / max(experts - 1, 1)
    return _plain(np.minimum(tokens * k, mean + largest_of_normals(ranks) * np.sqrt(variance)))


def fixed_seconds(layers: Any, experts: Any, layer_s: float, expert_s: float) -> Any:
    """The grouped GEMMs' fixed time: `layer_s` per MoE layer run and `expert_s` per expert
    each runs (experts summed over the layers)."""
    return layers * layer_s + experts * expert_s
