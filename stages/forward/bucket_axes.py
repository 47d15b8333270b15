"""The bucket axes: each axis's sizes resolved from the metadata config (explicit `sizes`,
or min/step/max where 0 derives a value from the limits the scheduler enforces), with a
ValueError naming the config key to change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stages.forward import engine_grids
from stages.forward.buckets import Axis
from stages.scheduling.kv_cache import blocks_for

AXES = ("prefill_batch", "prefill_seq", "prefill_blocks", "decode_batch", "decode_blocks")


def decode_blocks_limit(
    max_num_seqs: int, blocks_per_seq: int, num_blocks: int, prefix_caching: bool
) -> int:
    """The most blocks a decode step lists, all rows together. Each row lists its own
    blocks, at most a full row's and at most the pool. Without prefix caching the rows'
    blocks are distinct, so the pool bounds their sum too; with it, rows sharing a cached
    prefix list its blocks once each, and the sum can exceed the pool."""
    per_row = min(blocks_per_seq, num_blocks)
    if prefix_caching:
        return max_num_seqs * per_row
    return min(num_blocks, max_num_seqs * per_row)


def derived_axes(
    block_size: int,
    max_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    num_blocks: int,
    prefix_caching: bool = False,
) -> dict[str, dict[str, int]]:
    """Each bucket axis's min, step and max as derived from the limits the scheduler
    enforces: what a 0 in the config stands for."""
    blocks_per_seq = blocks_for(max_model_len, block_size)
    decode_blocks = decode_blocks_limit(max_num_seqs, blocks_per_seq, num_blocks, prefix_caching)
    distinct = decode_blocks_limit(max_num_seqs, blocks_per_seq, num_blocks, False)
    return {
        "prefill_batch": {"min": 1, "step": 1, "max": max_num_seqs},
        "prefill_seq": {"min": block_size, "step": block_size, "max": max_tokens},
        "prefill_blocks": {"min": 1, "step": 1, "max": blocks_per_seq},
        "decode_batch": {"min": 1, "step": 1, "max": max_num_seqs},
        # past the pool only rows sharing a prefix go: linear steps end there
        "decode_blocks": {"min": 1, "step": 1, "max": decode_blocks, "dense_max": distinct},
    }


def resolve_axes(
    given: Mapping[str, Mapping[str, Any]],
    block_size: int,
    max_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    num_blocks: int,
    prefix_caching: bool = False,
) -> dict[str, Axis]:
    """Each bucket axis from its config (`sizes`, or min/step/max with 0 derived from the
    limits); a ValueError names the key to change."""
    derived = derived_axes(
        block_size, max_tokens, max_num_seqs, max_model_len, num_blocks, prefix_caching
    )
    axes = {}
    for name in AXES:
        conf = given[name]
        bounds: dict[str, Any] = {
            key: conf[key] or derived[name][key] for key in ("min", "step", "max")
        }
        if not conf["max"]:  # a derived max keeps the derived dense range
            bounds["dense_max"] = derived[name].get("dense_max", 0)
        axis = Axis(**bounds)
        sizes = [int(v) for v in (conf.get("sizes") or ())]
        if sizes:
            _check_sizes(name, sizes, block_size)
            axis = Axis(min=sizes[0], step=axis.step, max=sizes[-1], explicit=tuple(sizes))
        if not 1 <= axis.min <= axis.max or axis.step < 1:
            raise ValueError(
                f"metadata.{name}: need 1 <= min <= max and step >= 1 (0 derives a value)"
            )
        axes[name] = axis
    if axes["prefill_seq"].step % block_size or axes["prefill_seq"].min % block_size:
        raise ValueError(
            "metadata.prefill_seq.min and .step must be multiples of block_size: a chunk "
            "is padded to whole blocks"
        )
    return axes


def _check_sizes(name: str, sizes: list[int], block_size: int) -> None:
    if sizes[0] < 1 or any(a >= b for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(
            f"metadata.{name}.sizes={sizes}: give increasing positive sizes, e.g. [1, 4, 16]"
        )
    if name == "prefill_seq" and any(size % block_size for size in sizes):
        raise ValueError(
            f"metadata.prefill_seq.sizes={sizes}: each must be a multiple of "
            f"block_size={block_size}, as a chunk is padded to whole blocks"
        )


def fastdeploy_axes(
    axes: Mapping[str, Axis], given: Mapping[str, int], limits: engine_grids.ServerLimits
) -> tuple[engine_grids.FastDeploySteps, dict[str, Axis]]:
    """FastDeploy's steps from `given` (FastDeploySteps' fields) and each bucket axis as
    FastDeploy pads it (the axes' steps kept: they round a miss's fallback)."""
    steps = engine_grids.FastDeploySteps(**dict(given))
    engine_grids.check_fastdeploy_steps(steps, limits.block_size)
    sizes = engine_grids.fastdeploy_sizes(steps, limits, axes["decode_blocks"].max)
    return steps, {
        name: Axis(min=v[0], step=axes[name].step, max=v[-1], explicit=tuple(v))
        for name, v in sizes.items()
    }
