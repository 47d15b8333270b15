"""Where a capacity search starts: a rate ceiling from the device's cost model and the
workload's mean lengths, before any probe is served.

In a steady state at rate R, each request costs the device one prefill of the mean prompt
(t_p) and, while B requests decode together, its share of mean-output-many decode steps
(t_d(B) / B each). So R(B) = B / (O x t_d(B) + B x t_p), and each request waits
t_d(B) / (1 - R x t_p) per output token (prefill steps take their share of the time). The
ceiling is the largest R(B) with B within max_num_seqs and the KV pool, and, with a TPOT
bound, that wait within it. Bucket padding, chunk interleaving and queueing only lower the
real capacity, so the search starts at or above it and comes down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stages.forward.step_shape import StepShape
from stages.scheduling.request import Request
from stages.simulator.cost_model import CostModel


@dataclass(frozen=True)
class Ceiling:
    rate: float  # requests/s
    batch: int  # requests decoding together at that rate


def rate_ceiling(
    cost: CostModel,
    requests: Sequence[Request],
    block_size: int,
    max_num_seqs: int,
    num_blocks: int,
    tpot_ms: float = 0.0,
) -> Ceiling | None:
    """The steady-state ceiling described above; None for an empty workload."""
    if not requests:
        return None
    prompt = max(1, round(float(np.mean([r.num_prompt_tokens for r in requests]))))
    output = max(1.0, float(np.mean([r.max_new_tokens for r in requests])))
    context = prompt + output / 2  # a decoding row's mean length
    per_row = math.ceil(context / block_size)
    rows = max(
        1, min(max_num_seqs, num_blocks // max(1, math.ceil((prompt + output) / block_size)))
    )
    prefill_s = cost.step_time(
        StepShape(
            block_size,
            prefill=(1, prompt, math.ceil(prompt / block_size)),
            decode=None,
            chunk_lens=(prompt,),
            context_lens=(0,),
        )
    )
    best: Ceiling | None = None
    for batch in range(1, rows + 1):
        lens = np.full(batch, int(context), dtype=np.int64)
        decode_s = cost.step_time(
            StepShape(block_size, prefill=None, decode=(batch, batch * per_row), decode_lens=lens)
        )
        rate = batch / (output * decode_s + batch * prefill_s)
        per_token_s = decode_s / (1 - rate * prefill_s)
        if best is not None and tpot_ms and per_token_s * 1e3 > tpot_ms:
            break  # the wait per token only grows with the batch
        if best is None or rate > best.rate:
            best = Ceiling(rate, batch)
    return best
