"""The GPU engines' execution model as a bucketing strategy (`metadata.bucketing=cudagraph`):
prefills run on their real tokens (one bucket wide enough for any step, which a GPU does not
pad to), decode batches are padded to the CUDA-graph capture sizes vLLM chooses, and start-up
captures one graph per size (after one profiling forward of the largest prefill) instead of
warming a bucket grid.

vLLM's default capture sizes (vllm/config/vllm.py, `VllmConfig._set_cudagraph_sizes`):
1, 2, 4, then multiples of 8 below 256, then multiples of 16, up to
max_cudagraph_capture_size = min(2 x max_num_seqs, 512). A larger decode batch runs without
a graph (eagerly), unpadded.

SGLang's (python/sglang/srt/server_args.py, `_generate_cuda_graph_batch_sizes`, v0.5):
1, 2, 4, 8, 12, multiples of 8 up to 256, of 16 up to 512, of 32 beyond, up to
--cuda-graph-max-bs (256 on an H100 or H200 below tp 4, its `_handle_gpu_memory_settings`)
and the running requests' pool. TensorRT-LLM's (tensorrt_llm/llmapi/llm_args.py,
`CudaGraphConfig._generate_cuda_graph_batch_sizes`, 1.0, padding off): 1..31, 32, 64, 128
and powers of two from 256 below max_batch_size (128 when not given). FastDeploy's
(fastdeploy/config.py, `GraphOptimizationConfig._set_cudagraph_sizes`, release 2.x): 1, 2,
4, multiples of 8 up to 128, of 16 up to 256, of 32 up to 1024, and its largest capture
size (max_num_seqs), those up to it kept.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping

from stages.forward.buckets import Axis, Bucketing

LARGEST_CAPTURE = 512  # vLLM's cap on the default largest capture size


class CaptureRule(enum.StrEnum):
    """Whose default CUDA-graph batch sizes; members are named by their values."""

    vllm = "vllm"
    fastdeploy = "fastdeploy"
    sglang = "sglang"
    trtllm = "trtllm"


def capture_sizes(
    max_num_seqs: int, rule: CaptureRule | str = CaptureRule.vllm, max_batch: int = 0
) -> list[int]:
    """An engine's default CUDA-graph capture sizes for `max_num_seqs`; max_batch: the
    engine's own largest size (SGLang's cuda_graph_max_bs, TensorRT-LLM's max_batch_size;
    0 = its default rule's)."""
    rule = CaptureRule(rule)
    if rule is CaptureRule.vllm:
        largest = min(2 * max_num_seqs, LARGEST_CAPTURE)
        sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    elif rule is CaptureRule.fastdeploy:  # its candidates up to max_num_seqs, and that
        largest = max_num_seqs
        sizes = [1, 2, 4, *range(8, 129, 8), *range(144, 257, 16), *range(288, 1025, 32)]
        sizes = sorted({*sizes, largest})
    elif rule is CaptureRule.sglang:  # capped by the running requests too
        largest = min(max_batch or 256, max_num_seqs)
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, largest + 1, 32)]  # fmt: skip
    else:  # TensorRT-LLM captures up to its max_batch_size, whatever the server's
        largest = max_batch or 128
        powers = [2**i for i in range(8, math.ceil(math.log2(largest)))] if largest > 256 else []
        sizes = [*range(1, 32), 32, 64, 128, *powers]
    return [s for s in sizes if s <= largest]


def cudagraph_axes(
    axes: Mapping[str, Axis],
    max_num_seqs: int,
    rule: CaptureRule | str = CaptureRule.vllm,
    max_batch: int = 0,
) -> dict[str, Axis]:
    """The bucket axes under the GPU model: decode batches at the engine's capture sizes;
    every other axis one size, its largest (a GPU computes the real tokens; no step pads
    to it)."""
    out = {}
    for name, axis in axes.items():
        if name == "decode_batch":
            sizes = tuple(capture_sizes(max_num_seqs, rule, max_batch))
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
