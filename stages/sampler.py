"""Turns each row of logits into the next token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from stages.request import Request


@dataclass
class Samples:
    token_ids: np.ndarray  # [rows] int64, one per logits row
    logprobs: list[dict[int, float]] | None = None  # per row: top-k token id -> log-probability


class GreedySampler:
    """Takes the most likely token of every row."""

    def __init__(self, logprobs: int = 0) -> None:
        self.logprobs = logprobs

    def validate_request(self, request: Request) -> str | None:
        return None

    def sample(self, logits: paddle.Tensor, requests: Sequence[Request]) -> Samples:
        return Samples(paddle.argmax(logits, axis=-1).numpy().astype(np.int64))
