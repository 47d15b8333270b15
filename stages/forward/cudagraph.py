"""The GPU engines' execution model as a bucketing strategy (`metadata.bucketing=cudagraph`):
prefills run on their real tokens (one bucket wide enough for any step, which a GPU does not
pad to), decode batches are padded to the CUDA-graph capture sizes vLLM chooses, and start-up
captures one graph per size (after one profiling forward of the largest prefill) instead of
warming a bucket grid.

vLLM's default capture sizes (vllm/config/vllm.py, `VllmConfig._set_cudagraph_sizes`):
1, 2, 4, then multiples of 8 below 256, then multiples of 16, up to
max_cudagraph_capture_size = min(2 x max_num_seqs, 512). A larger decode batch runs without
a graph (eagerly), unpadded.
"""

from __future__ import annotations

from collections.abc import Mapping

from stages.forward.buckets import Axis, Bucketing

LARGEST_CAPTURE = 512  # vLLM's cap on the default largest capture size


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default CUDA-graph capture sizes for `max_num_seqs`."""
    largest = min(2 * max_num_seqs, LARGEST_CAPTURE)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return [s for s in sizes if s <= largest]


def cudagraph_axes(axes: Mapping[str, Axis], max_num_seqs: int) -> dict[str, Axis]:
    """The bucket axes under the GPU model: decode batches at the capture sizes; every other
    axis one size, its largest (a GPU computes the real tokens; no step pads to it)."""
    out = {}
    for name, axis in axes.items():
        if name == "decode_batch":
            sizes = tuple(capture_sizes(max_num_seqs))
        else:
            sizes = (axis.sizes(Bucketing.linear)[-1],)
        out[name] = Axis(axis.min, axis.step, axis.max, explicit=sizes)
    return out


def cudagraph_warmup(sizes: Mapping[str, list[int]]) -> dict[str, list[tuple]]:
    """Start-up as the GPU engines do it: one profiling forward of the widest prefill, then
    one decode graph captured per capture size."""
    prefill = (sizes["prefill_batch"][-1], sizes["prefill_seq"][-1], sizes["prefill_blocks"][-1])
    blocks = sizes["decode_blocks"][-1]
    return {
        "profile_run": [(prefill, None)],
        "cuda_graphs": [(None, (batch, blocks)) for batch in sizes["decode_batch"]],
    }
