"""Safetensors reading: headers checked against the weight plan, then each tensor read in
blocks of whole rows straight into its place in the model's layout and handed to Paddle
without a copy, so loading needs little more memory than the loaded model."""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import safe_open

from stages.loading.checkpoint.weight_plan import Placement, WeightPlan

if TYPE_CHECKING:  # reading headers needs no Paddle; loading weights imports it
    import paddle


def open_safetensors(path: Path):
    try:
        return safe_open(str(path), framework="numpy")
    except Exception as err:  # safetensors raises its own error types for a corrupt header
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from err


# How each stored dtype is read; bfloat16, which numpy lacks, as 16-bit words then widened.
_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}
# A tensor is read in blocks of whole rows of at most this size (one row at least), so
# reading never holds a second copy of a large tensor (an embedding, an lm_head).
CHUNK_BYTES = 2 << 20


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """Where the data starts and the header (an 8-byte little-endian length, then JSON)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as err:  # JSON and UTF-8 errors included
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from err
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a readable safetensors file: its header is no object")
    return 8 + length, header


def _as_rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A stored shape as rows of its last axis, [-1, last], the view placements' rows
    index; a vector stays one (its rows are single values)."""
    return shape if len(shape) <= 2 else (math.prod(shape[:-1]), shape[-1])


def _row_blocks(
    file, offset: int, kind: str, shape: tuple[int, ...]
) -> Iterator[tuple[int, np.ndarray]]:
    """A stored tensor as float32 blocks of whole rows: (first row, block [rows, ...])."""
    rows, row_shape = (shape[0], shape[1:]) if shape else (1, ())
    row_items = math.prod(row_shape)
    stored = np.dtype(_NUMPY_DTYPES[kind])
    step = max(1, CHUNK_BYTES // max(1, row_items * stored.itemsize))
    for first in range(0, rows, step):
        count = min(step, rows - first) * row_items
        raw = np.empty(count, dtype=stored)
        file.seek(offset + first * row_items * stored.itemsize)
        if file.readinto(raw.data.cast("B")) != raw.nbytes:
            raise ValueError(f"{file.name} ends inside a tensor: the file is truncated")
        if kind == "BF16":  # a bfloat16 is the top half of a float32
            wide = raw.astype(np.uint32)
            wide <<= 16
            block = wide.view(np.float32)
        else:
            block = raw.astype(np.float32, copy=False)
        yield first, block.reshape((-1, *row_shape))


def place_block(target: np.ndarray, placement: Placement, first: int, block: np.ndarray) -> None:
    """Writes rows first.. of a stored tensor to where the model keeps them: the rows of the
    placement's part, if it has one, counted from the part's first."""
    if placement.rows is not None:
        lo, hi = max(first, placement.rows.start), min(first + len(block), placement.rows.stop)
        if lo >= hi:
            return
        block, first = block[lo - first : hi - first], lo - placement.rows.start
    start = placement.cols.start if placement.cols is not None else 0
    if placement.transpose:  # HF Linear rows are output features: columns of [in, out]
        target[:, start + first : start + first + block.shape[0]] = block.T
        return
    # Untransposed targets are whole buffers or 1-D slices, contiguous: fill them in order.
    flat = target.reshape(-1) if placement.cols is None else target[placement.cols]
    row_items = block.size // block.shape[0]
    flat[first * row_items : first * row_items + block.size] = block.reshape(-1)


def to_paddle(buffer: np.ndarray, dtype: str) -> paddle.Tensor:
    import paddle
    from paddle.utils import dlpack

    if dtype == "float32":
        return dlpack.from_dlpack(buffer)  # shares the buffer: no second copy while loading
    return paddle.to_tensor(buffer).astype(dtype)


def check_headers(
    files: Mapping[str, Path], plan: WeightPlan, folder: Path
) -> dict[Path, list[str]]:
    """Every planned tensor is stored, with its shape and a readable dtype, from the
    safetensors headers alone; returns the planned names by shard."""
    missing = [key for key in plan.shapes if key not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"weight {missing[0]} is missing from {folder}{more}")
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for key in plan.shapes:
        by_shard[files[key]].append(key)
    for path, keys in by_shard.items():
        with open_safetensors(path) as handle:  # safetensors checks each header as it opens it
            for key in keys:
                stored = handle.get_slice(key)
                shape, kind = tuple(stored.get_shape()), stored.get_dtype()
                if shape != plan.shapes[key]:
                    raise ValueError(
                        f"weight {key} has shape {list(shape)}, expected {list(plan.shapes[key])}"
                    )
                if kind not in _NUMPY_DTYPES:
                    raise ValueError(
                        f"weight {key} is stored as {kind}: supported are "
                        f"{', '.join(_NUMPY_DTYPES)}"
                    )
    return by_shard


def load_state(
    files: Mapping[str, Path], plan: WeightPlan, dtype: str, folder: Path
) -> dict[str, paddle.Tensor]:
    """Reads every planned tensor, shard by shard and block by block, into the model's
    layout; each model tensor goes to Paddle as soon as its last part is in."""
    by_shard = check_headers(files, plan, folder)  # every shape and dtype before any data
    pending = plan.parts_per_buffer()
    buffers: dict[str, np.ndarray] = {}
    state: dict[str, paddle.Tensor] = {}
    for path, keys in by_shard.items():
        data_start, header = read_header(path)
        with path.open("rb") as file:
            for key in keys:
                placements, entry = plan.placements[key], header[key]
                for dest in {p.dest for p in placements} - buffers.keys():
                    buffers[dest] = np.empty(plan.buffers[dest], dtype=np.float32)
                offset = data_start + entry["data_offsets"][0]
                rows = _as_rows(plan.shapes[key])
                for first, block in _row_blocks(file, offset, entry["dtype"], rows):
                    for placement in placements:
                        place_block(buffers[placement.dest], placement, first, block)
                for dest in (p.dest for p in placements):
                    pending[dest] -= 1
                    if not pending[dest]:
                        keep32 = dest in plan.float32_buffers
                        state[dest] = to_paddle(buffers.pop(dest), "float32" if keep32 else dtype)
    return state
