"""Where a step's requests are among the scheduler's running rows: what the scheduler's walk
records for its update, and what a run of decode steps planned from the step starts from."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from stages.scheduling.request import StepPlan

# A step's decode rows in `running`: a slice where they are one run of rows (the common
# step; numpy reads a slice as a view, without gathering), else their indices.
DecodeRows = slice | np.ndarray
NO_ROWS = slice(0, 0)


class RowFate(enum.Enum):
    """What a running row got at its turn in a step's walk (ChunkedScheduler._continue_one)."""

    DECODE = "decode"  # its next token
    PREFILL = "prefill"  # its next chunk
    WAITS = "waits"  # nothing: no chunk fits this step
    PREEMPTED = "preempted"  # it was preempted itself, which ends the walk


@dataclass(slots=True)
class StepRows:
    """Where a plan's requests are in `running`: one row per prefill chunk, and the spans
    of rows its decodes are."""

    plan: StepPlan
    prefill: list[int]
    decode_spans: list[tuple[int, int]]
    decode_rows: DecodeRows  # decode(), once walked

    def decode(self) -> DecodeRows:
        spans = self.decode_spans
        if len(spans) <= 1:  # the common step: its decodes are one run of rows
            return slice(*spans[0]) if spans else NO_ROWS
        return np.concatenate([np.arange(start, end) for start, end in spans])


def row_at(rows: DecodeRows, k: int) -> int:
    """The running row of a step's k-th decode."""
    return rows.start + k if isinstance(rows, slice) else int(rows[k])
