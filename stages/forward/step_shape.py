"""The shape of one engine step: its padded buckets and real lengths, which the metadata
builder lays out and a device (simulated, or calibrated on steps.jsonl) prices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stages.arithmetic import ceil_div

# Decode rows beyond which sums over a step's rows are numpy's: each numpy call costs a
# few us, more than Python's sums over a handful of rows read once with tolist().
MANY_ROWS = 32


# Not frozen, though nothing changes one once made: a simulated device makes one a step,
# and a frozen dataclass's __init__ costs several times a plain one's.
@dataclass(slots=True)
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
    # decode_totals(decode_lens, block_size) where the shape's maker summed them already
    # (the metadata builder, for the decode bucket): a device reads them instead of the rows.
    # Its maker made the lengths too (each row's tokens): they are not checked again.
    decode_kv: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        # Checked at every step, so in few calls: min() on the tuples, on a few rows' list.
        prefill, decode, lens = self.prefill, self.decode, self.decode_lens
        chunks, contexts = self.chunk_lens, self.context_lens
        if self.block_size < 1:
            raise ValueError(f"StepShape: block_size={self.block_size} must be >= 1")
        if prefill is not None and (len(prefill) != 3 or min(prefill) < 0):
            raise ValueError(f"StepShape: prefill={prefill} must be 3 dimensions, none negative")
        if decode is not None and (len(decode) != 2 or min(decode) < 0):
            raise ValueError(f"StepShape: decode={decode} must be 2 dimensions, none negative")
        if contexts and len(contexts) != len(chunks):
            raise ValueError(
                f"StepShape: {len(contexts)} context_lens for {len(chunks)} chunk_lens; "
                "give one per prefill row"
            )
        if (
            (chunks and min(chunks) < 0)
            or (contexts and min(contexts) < 0)
            or (self.decode_kv is None and len(lens) and _least(lens) < 0)
        ):
            raise ValueError("StepShape: chunk, context and decode lengths must be >= 0")


def _least(lens: tuple[int, ...] | np.ndarray) -> int:
    """The smallest of some lengths (at least one)."""
    if not isinstance(lens, np.ndarray):
        return min(lens)
    return int(lens.min()) if len(lens) > MANY_ROWS else min(lens.tolist())


def decode_totals(lens: tuple[int, ...] | np.ndarray, block_size: int) -> tuple[int, int]:
    """The tokens decode rows of these lengths attend to, and the KV blocks they fill:
    (sum(lens), sum(ceil(len / block_size)))."""
    if isinstance(lens, np.ndarray):
        if len(lens) > MANY_ROWS:
            return int(lens.sum()), int(ceil_div(lens, block_size).sum())
        lens = lens.tolist()
    # ceil_div's rounding, inline: a call per row would cost more than the sum itself
    return sum(lens), sum([(n + block_size - 1) // block_size for n in lens])
