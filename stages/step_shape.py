"""The shape of one engine step: its padded buckets and real lengths, which the metadata
builder lays out and a device (simulated, or calibrated on steps.jsonl) prices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepShape:
    """One step's padded buckets and, for devices that compute real tokens, its real lengths.

    The HPU computes the padded bucket: prefill rows x seq tokens through every GEMM, prefill
    attention over blocks-per-row x block_size keys for each of seq queries, decode attention
    over the bucket's blocks x block_size KV slots, and R decode rows through the GEMMs.
    """

    block_size: int
    prefill: tuple[int, int, int] | None  # padded bucket (rows, seq tokens, blocks per row)
    decode: tuple[int, int] | None  # padded bucket (rows, blocks of all rows)
    chunk_lens: tuple[int, ...] = ()  # real tokens of each prefill row
    context_lens: tuple[int, ...] = ()  # tokens already cached before each chunk
    # tokens each decode row attends to (incl. its new one): a tuple, or the metadata
    # builder's int array as it is (thousands of rows a step, read once as an array)
    decode_lens: tuple[int, ...] | np.ndarray = ()
    miss: bool = False  # the bucket is outside the prepared (warmed) set

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"StepShape: block_size={self.block_size} must be >= 1")
        for name, dims, size in (("prefill", self.prefill, 3), ("decode", self.decode, 2)):
            if dims is not None and (len(dims) != size or min(dims) < 0):
                raise ValueError(
                    f"StepShape: {name}={dims} must be {size} dimensions, none negative"
                )
        if len(self.context_lens) not in (0, len(self.chunk_lens)):
            raise ValueError(
                f"StepShape: {len(self.context_lens)} context_lens for "
                f"{len(self.chunk_lens)} chunk_lens; give one per prefill row"
            )
        # Checked at every step: min() on the tuples, the array's own min (np.min costs more).
        decode = self.decode_lens
        if (
            (self.chunk_lens and min(self.chunk_lens) < 0)
            or (self.context_lens and min(self.context_lens) < 0)
            or (
                len(decode)
                and (decode.min() if isinstance(decode, np.ndarray) else min(decode)) < 0
            )
        ):
            raise ValueError("StepShape: chunk, context and decode lengths must be >= 0")
