"""Log-probabilities a request asks for, computed beside its samples in the same step.

They are of the model's raw distribution, the log-softmax of the logits before temperature,
top-k and top-p (vLLM's default `logprobs_mode`, raw_logprobs): what the model says, whatever
the sampling settings. Each entry maps token id -> log-probability: the k most likely tokens,
most likely first, then the scored token (the sampled one, or the prompt's next token) where
it is not among them. Nothing here runs when no request asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stages.sampling.token_ranking import log_softmax, rank_keys, top_indices
from stages.scheduling.request import PromptSpan, Request


def asked_counts(requests: Sequence[Request], default: int) -> list[int | None] | None:
    """Per row, how many alternatives its logprobs list (None: the row asks none); None
    where no row asks. `default`: the run's sampler.logprobs (0 = off), which a request's
    own count overrides."""
    counts = [r.sampling.logprobs for r in requests]
    if default:
        return [default if k is None else k for k in counts]
    return counts if any(k is not None for k in counts) else None


def entries(logits: np.ndarray, tokens: np.ndarray, counts: Sequence[int | None]) -> list:
    """Per row, its `counts[row]` most likely tokens and the scored token `tokens[row]` with
    their log-probabilities; None for a row that asks none."""
    asking = [row for row, k in enumerate(counts) if k is not None]
    out: list[dict[int, float] | None] = [None] * len(counts)
    if not asking:
        return out
    x = logits[asking] if len(asking) < len(counts) else logits
    logp = log_softmax(x)
    most = min(max(counts[row] or 0 for row in asking), x.shape[-1])
    top = top_indices(rank_keys(x), most) if most else np.zeros((len(asking), 0), np.int64)
    top_values = np.take_along_axis(logp, top, axis=-1)
    for i, row in enumerate(asking):
        k = counts[row] or 0
        entry = dict(zip(top[i, :k].tolist(), top_values[i, :k].tolist(), strict=True))
        token = int(tokens[row])
        entry.setdefault(token, float(logp[i, token]))
        out[row] = entry
    return out


def score_prompts(logits: Any, spans: Sequence[PromptSpan]) -> Any:
    """Keeps the prompt log-probabilities of the spans, whose rows end `logits` (a tensor
    [rows, vocab]), in their requests; returns the rows before them, the samples' logits."""
    rows = sum(span.end - span.start for span in spans)
    sampled = logits.shape[0] - rows
    scored = logits[sampled:].numpy()
    first = 0
    for span in spans:
        request, n = span.request, span.end - span.start
        ids = request.prompt_ids
        following = np.array([ids[p] for p in range(span.start + 1, span.end + 1)], np.int64)
        k = request.sampling.prompt_logprobs
        block = entries(scored[first : first + n], following, [k] * n)
        if request.prompt_logprobs is None:
            request.prompt_logprobs = []
        del request.prompt_logprobs[span.start :]
        request.prompt_logprobs.extend(block)
        first += n
    return logits[:sampled]
