"""The warmup grids the serving engines themselves build, so that a Gaudi prediction
counts the graphs the engine will compile, not ours.

FastDeploy: its HPU runner's `warm_up_bucket` (fastdeploy/worker/hpu_model_runner.py)
walks prefill batches 1..MAX_PREFILL_NUM, prefill lengths (context included) from one
block to HPU_WARMUP_MODEL_LEN, decode batches and decode block totals from environment
steps; at serving its `prepare_block_metadata` op pads a decode batch to
min(round-up to BATCH_STEP_DECODE, next power of two) and the block list to a multiple
of BLOCK_STEP_DECODE, and leaves a prefill batch unpadded. Modelled here from reading
that code; the tests give the grids worked by hand from it.

vllm-gaudi: `warmup_range` (linear: min doubles until step, then step to max) and
`warmup_range_with_limit` (exponential: `limit` sizes spaced geometrically from min to
max, each rounded up to step, 0 or 1 kept as its own first bucket), from
vllm_gaudi/extension/bucketing/{linear,exponential}.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stages.arithmetic import ceil_div


@dataclass(frozen=True)
class FastDeploySteps:
    """FastDeploy's warmup environment, by its names (defaults: its own)."""

    max_prefill_num: int = 3  # MAX_PREFILL_NUM
    batch_step_prefill: int = 1  # BATCH_STEP_PREFILL
    sequence_step_prefill: int = 128  # SEQUENCE_STEP_PREFILL
    context_block_step_prefill: int = 1  # CONTEXT_BLOCK_STEP_PREFILL
    batch_step_decode: int = 4  # BATCH_STEP_DECODE
    block_step_decode: int = 16  # BLOCK_STEP_DECODE
    warmup_model_len: int = 4096  # HPU_WARMUP_MODEL_LEN (capped by max_model_len)
    recipe_cache_num: int = 0  # FLAGS_intel_hpu_recipe_cache_num (0: not set)
    enc_dec_block_num: int = 2  # FD_ENC_DEC_BLOCK_NUM: decode blocks kept per request

    def env(self) -> dict[str, int]:
        """The environment variables that give FastDeploy this grid."""
        named = {
            "MAX_PREFILL_NUM": self.max_prefill_num,
            "BATCH_STEP_PREFILL": self.batch_step_prefill,
            "SEQUENCE_STEP_PREFILL": self.sequence_step_prefill,
            "CONTEXT_BLOCK_STEP_PREFILL": self.context_block_step_prefill,
            "BATCH_STEP_DECODE": self.batch_step_decode,
            "BLOCK_STEP_DECODE": self.block_step_decode,
            "HPU_WARMUP_MODEL_LEN": self.warmup_model_len,
        }
        if self.recipe_cache_num:
            named["FLAGS_intel_hpu_recipe_cache_num"] = self.recipe_cache_num
        return named

    def check(self) -> None:
        steps = {k: v for k, v in self.env().items() if k != "FLAGS_intel_hpu_recipe_cache_num"}
        bad = [k for k, v in steps.items() if v < 1]
        if bad or self.recipe_cache_num < 0:
            raise ValueError(f"metadata.fastdeploy: {', '.join(bad) or 'recipe_cache_num'} "
                             "needs 1 or more (recipe_cache_num: 0 = not set)")  # fmt: skip


def check_fastdeploy_steps(steps: FastDeploySteps, block_size: int) -> None:
    """Steps FastDeploy can warm at this block size: each 1 or more, and prefill lengths
    stepped by whole blocks (its benchmark README: SEQUENCE_STEP_PREFILL is the block
    size; a step between blocks pads every prompt past what the grid warmed)."""
    steps.check()
    if steps.sequence_step_prefill % block_size:
        raise ValueError(
            f"metadata.fastdeploy.sequence_step_prefill={steps.sequence_step_prefill} is not "
            f"a multiple of block_size={block_size}: FastDeploy steps prefill lengths by whole "
            f"blocks; set it to {block_size} (its default) or a multiple"
        )


@dataclass(frozen=True)
class ServerLimits:
    """The server settings FastDeploy's warmup reads besides its environment."""

    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    num_gpu_blocks: int
    prefix_caching: bool
    chunked_prefill: bool


FastDeploySetup = tuple[FastDeploySteps, ServerLimits]  # what a builder keeps for warmup


@dataclass
class FastDeployGrid:
    """The forward passes FastDeploy's warmup runs: prefill (batch, query tokens, context
    tokens), decode (batch, block total), mixed (query tokens, context tokens, decode
    batch, decode block total; one prefill row). The recipes they compile are counted by
    part_graphs(whole=True): a mixed run shares its parts' attention recipes with the
    prefill and decode runs of those shapes (step_graphs)."""

    prefill: list[tuple[int, int, int]] = field(default_factory=list)
    decode: list[tuple[int, int]] = field(default_factory=list)
    mixed: list[tuple[int, int, int, int]] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.prefill) + len(self.decode) + len(self.mixed)


def _stepped(step: int, top: int) -> list[int]:
    """step, 2 step, ... up to top (FastDeploy's `while current <= top` loops)."""
    return list(range(step, top + 1, step))


def _contexts(length: int, block_size: int, steps: FastDeploySteps, caching: bool) -> list[int]:
    """The context lengths warmed beside a prefill of `length` tokens: 0 alone without
    prefix caching (its loop breaks after the first)."""
    every = range(0, length, block_size * steps.context_block_step_prefill)
    return list(every) if caching else [0]


def _decode_pairs(
    batches: list[int], totals: list[int], block_size: int, model_len: int
) -> list[tuple[int, int]]:
    """(batch, total) pairs warmed: a total below the batch, or whose first row (the
    total split evenly, the remainder to the first rows) is longer than the model
    length, is skipped."""
    return [
        (b, t)
        for b in batches
        for t in totals
        if t >= b and ceil_div(t, b) * block_size <= model_len
    ]


def fastdeploy_grid(steps: FastDeploySteps, limits: ServerLimits) -> FastDeployGrid:
    """The warmup runs of FastDeploy's HPU runner, in its order (largest first)."""
    bs = limits.block_size
    model_len = min(steps.warmup_model_len, limits.max_model_len)
    prefill_batches = _stepped(steps.batch_step_prefill, steps.max_prefill_num)[::-1]
    lengths = list(range(bs, bs + model_len, steps.sequence_step_prefill))[::-1]
    grid = FastDeployGrid()
    for b in prefill_batches:
        for length in lengths:
            if length * b > limits.max_num_batched_tokens:
                continue
            for ctx in _contexts(length, bs, steps, limits.prefix_caching):
                grid.prefill.append((b, length - ctx, ctx))
    decode_batches = _stepped(steps.batch_step_decode, limits.max_num_seqs)[::-1]
    per_row = ceil_div(model_len, bs) + steps.enc_dec_block_num
    top = min(limits.num_gpu_blocks, per_row * limits.max_num_seqs)
    totals = _stepped(steps.block_step_decode, top)[::-1]
    grid.decode = _decode_pairs(decode_batches, totals, bs, model_len)
    if limits.chunked_prefill:  # every 4th of each list, one prefill row beside decodes
        for b, t in _decode_pairs(decode_batches[::4], totals[::4], bs, model_len):
            if 1 + b > limits.max_num_seqs:
                continue
            for length in lengths[::4]:
                for ctx in _contexts(length, bs, steps, limits.prefix_caching):
                    grid.mixed.append((length - ctx, ctx, b, t))
    return grid


def fastdeploy_sizes(
    steps: FastDeploySteps, limits: ServerLimits, blocks_top: int
) -> dict[str, list[int]]:
    """The sizes FastDeploy pads a served step to, per bucket axis: a prefill batch as it
    is, a chunk to whole blocks, a prefill table to CONTEXT_BLOCK_STEP_PREFILL blocks, a
    decode batch as fastdeploy_decode_batch, a decode block list to BLOCK_STEP_DECODE
    blocks (up to blocks_top, the most a decode step lists)."""
    bs, ctx_step = limits.block_size, steps.context_block_step_prefill
    per_seq = ceil_div(limits.max_model_len, bs)
    rows = range(1, limits.max_num_seqs + 1)
    return {
        "prefill_batch": list(rows),
        "prefill_seq": _stepped(bs, ceil_div(limits.max_num_batched_tokens, bs) * bs),
        "prefill_blocks": _stepped(ctx_step, ceil_div(per_seq, ctx_step) * ctx_step),
        "decode_batch": sorted(
            {fastdeploy_decode_batch(r, steps.batch_step_decode, limits.max_num_seqs) for r in rows}
        ),
        "decode_blocks": _stepped(
            steps.block_step_decode,
            ceil_div(blocks_top, steps.block_step_decode) * steps.block_step_decode,
        ),
    }


def fastdeploy_warmup(steps: FastDeploySteps, limits: ServerLimits) -> dict[str, list[tuple]]:
    """FastDeploy's warmup runs as (prefill, decode) bucket pairs of our axes: a prefill
    of q tokens after ctx context ones pads to (batch, q, its table's blocks rounded up to
    CONTEXT_BLOCK_STEP_PREFILL)."""
    grid = fastdeploy_grid(steps, limits)
    ctx_step = steps.context_block_step_prefill

    def table(q: int, ctx: int) -> int:
        return ceil_div(ceil_div(q + ctx, limits.block_size), ctx_step) * ctx_step

    return {
        "prefill": [((b, q, table(q, ctx)), None) for b, q, ctx in grid.prefill],
        "decode": [(None, d) for d in grid.decode],
        "mixed": [((1, q, table(q, ctx)), (b, t)) for q, ctx, b, t in grid.mixed],
    }


def step_graphs(prefill: tuple | None, decode: tuple | None, whole: bool) -> list[tuple]:
    """The compiled graphs a step runs: its prefill part's and its decode part's shape;
    and (whole: FastDeploy's HPU runner) for a mixed step, the recipes of the ops that
    run over all its tokens at once, keyed by its total tokens and rows.

    FastDeploy (release/2.3) runs a mixed step as one forward pass over the prefill
    tokens followed by the decode rows (fastdeploy/worker/hpu_model_runner.py
    `_prepare_inputs`: `ids_remove_padding` is the two concatenated). Its attention
    backend splits them again (fastdeploy/model_executor/layers/backends/intel_hpu/
    attention/hpu_attn_backend.py `forward_mixed`: fused_qkv_rope and fused_sdpa_proj
    on `src[:-decoder_num]`, fused_block_attention on `src[-decoder_num:]`), so the
    attention ops run at the shapes a prefill or a decode step of those parts runs. The
    other ops (norms, projections, MLP/MoE, logits) run on the whole: PaddleCustomDevice's
    intel_hpu kernels compile one recipe per op and input shapes (`OpCacheOperator::
    prepareOpInfo(name, inputs_dims, params)`, backends/intel_hpu/custom_ops/llama_infer/
    fused_mlp.cc), so a mixed step compiles them anew only at a total
    (prefill rows x padded length + decode rows, prefill + decode rows) no step had before.
    A graph here is such a set of op recipes at one shape."""
    parts: list[tuple] = [("prefill", prefill)] if prefill is not None else []
    if decode is not None:
        parts.append(("decode", decode))
    if whole and prefill is not None and decode is not None:
        (rows, seq, _), padded_rows = prefill, decode[0]
        parts.append(("mixed", rows * seq + padded_rows, rows + padded_rows))
    return parts


def part_graphs(phases: dict[str, list[tuple]], whole: bool = False) -> dict[str, int]:
    """The graphs each phase compiles that no earlier phase did (as step_graphs counts a
    step's graphs, which the simulated device compiles)."""
    seen: set[tuple] = set()
    counts = {}
    for phase, pairs in phases.items():
        before = len(seen)
        for prefill, decode in pairs:
            seen.update(step_graphs(prefill, decode, whole))
        counts[phase] = len(seen) - before
    return counts


def fastdeploy_decode_batch(rows: int, step: int, max_batches: int) -> int:
    """The batch FastDeploy pads a decode step of `rows` rows to (its find_bucket):
    1 for one row, else the least of the round-up to step, the next power of two and the
    largest batch."""
    if rows <= 1:
        return 1
    return min(ceil_div(rows, step) * step, 1 << (rows - 1).bit_length(), max_batches)


def vllm_linear_range(bmin: int, step: int, bmax: int) -> list[int]:
    """vllm-gaudi's linear range: min doubling while below step (and max), then every
    step up to max; a min of 0 starts at step and keeps a 0 bucket."""
    zero = bmin == 0
    if zero and bmax == 0:
        return [0]
    start = step if zero else bmin
    ramp, n = [], start
    while n < step and n <= bmax:
        ramp.append(n)
        n *= 2
    sizes = [s for s in ramp + list(range(step, bmax + 1, step)) if s >= start]
    return sorted([*sizes, 0]) if zero else sizes


def vllm_exponential_range(bmin: int, step: int, bmax: int, limit: int) -> list[int]:
    """vllm-gaudi's exponential range: `limit` sizes spaced geometrically from min (or
    step, for a min of 0 or 1, which is kept as its own bucket) to max, each rounded up
    to step, duplicates dropped, the largest clamped to max."""
    if limit <= 1:
        return [bmax]
    low = step if bmin in (0, 1) else bmin
    sizes = {math.ceil(low * (bmax / low) ** (i / (limit - 1)) / step) * step for i in range(limit)}
    if bmin in (0, 1):
        sizes.add(bmin)
    ordered = sorted(sizes)
    ordered[-1] = min(ordered[-1], bmax)
    return ordered


def vllm_padding_range(
    bmin: int, step: int, bmax: int, pad_max: int, pad_percent: int
) -> list[int]:
    """vllm-gaudi's padding-aware range: min doubling up to step, then of the sizes every
    step apart only those whose successor would pad more than pad_percent of itself or
    more than pad_max tokens (or that are multiples of pad_max); max always last."""
    pad_max = pad_max or bmax
    sizes, size = [bmin], bmin
    while size <= bmax:
        last = sizes[-1]
        if size <= step:  # the ramp: doubling from the last kept size (0 goes to 1)
            following = last * 2 or 1
            if following <= bmax:
                sizes.append(following)
        else:
            following = size + step
            padding = following - last - 1
            if size != last and (
                padding / following > pad_percent / 100 or padding > pad_max or size % pad_max == 0
            ):
                sizes.append(size)
        size = following
    return sizes if sizes[-1] == bmax else [*sizes, bmax]


def vllm_limit(bmax: int) -> int:
    """vllm-gaudi's number of exponential sizes for an axis up to bmax: ceil(log2) + 1."""
    return math.ceil(math.log2(bmax)) + 1 if bmax > 1 else 1
