"""The engines' own warmup grids against lists worked by hand from their code:
FastDeploy's fastdeploy/worker/hpu_model_runner.py `warm_up_bucket` and its
`prepare_block_metadata` op, vllm-gaudi's vllm_gaudi/extension/bucketing/{linear,
exponential,padding_aware}.py."""

from __future__ import annotations

import pytest

from stages.forward.buckets import Axis, Bucketing
from stages.forward.engine_grids import (
    FastDeploySteps,
    ServerLimits,
    fastdeploy_decode_batch,
    fastdeploy_grid,
    fastdeploy_warmup,
    part_graphs,
    step_graphs,
    vllm_exponential_range,
    vllm_linear_range,
    vllm_padding_range,
)

# MAX_PREFILL_NUM=2, BATCH_STEP_PREFILL=1, SEQUENCE_STEP_PREFILL=128,
# CONTEXT_BLOCK_STEP_PREFILL=1, BATCH_STEP_DECODE=2, BLOCK_STEP_DECODE=2,
# HPU_WARMUP_MODEL_LEN=384
SMALL = FastDeploySteps(2, 1, 128, 1, 2, 2, 384)


def limits(seqs: int = 4, caching: bool = False, chunked: bool = False) -> ServerLimits:
    # block 128, max_num_batched_tokens 512, max_model_len 1024, 100 blocks
    return ServerLimits(128, 512, seqs, 1024, 100, caching, chunked)


def test_fastdeploy_prefill_runs_worked_by_hand():
    # batches [2, 1] (largest first); lengths range(128, 128 + 384, 128) = [384, 256, 128];
    # 2 x 384 = 768 > 512 tokens is skipped; without prefix caching context 0 only
    grid = fastdeploy_grid(SMALL, limits())
    assert grid.prefill == [(2, 256, 0), (2, 128, 0), (1, 384, 0), (1, 256, 0), (1, 128, 0)]


def test_fastdeploy_prefill_contexts_with_prefix_caching():
    # each length L also after every whole block of context below it: range(0, L, 128)
    grid = fastdeploy_grid(SMALL, limits(caching=True))
    assert grid.prefill == [
        (2, 256, 0), (2, 128, 128), (2, 128, 0),
        (1, 384, 0), (1, 256, 128), (1, 128, 256), (1, 256, 0), (1, 128, 128), (1, 128, 0),
    ]  # fmt: skip


def test_fastdeploy_decode_runs_worked_by_hand():
    # batches [4, 2]; per row ceil(384/128) + 2 = 5 blocks, totals 2..min(100, 5 x 4) = 20
    # by 2; a total below the batch, or whose first row ceil(total / batch) x 128 is past
    # 384 tokens, is skipped: batch 4 keeps totals up to 12, batch 2 up to 6
    grid = fastdeploy_grid(SMALL, limits())
    assert grid.decode == [(4, 12), (4, 10), (4, 8), (4, 6), (4, 4), (2, 6), (2, 4), (2, 2)]
    assert grid.mixed == []  # no chunked prefill: no mixed phase


def test_fastdeploy_mixed_runs_every_fourth():
    # max_num_seqs 5: totals 2..24 by 2, reversed, every 4th: [24, 16, 8]; batches [4]
    # ([4, 2][::4]); only 8 blocks fit batch 4 within 384 tokens a row; 1 + 4 <= 5 rows;
    # lengths [384, 256, 128][::4] = [384]
    grid = fastdeploy_grid(SMALL, limits(seqs=5, chunked=True))
    assert grid.mixed == [(384, 0, 4, 8)]
    assert len(grid.decode) == 8 and grid.runs == 5 + 8 + 1
    # with 4 rows, a prefill row beside 4 decodes is more than max_num_seqs: none
    assert fastdeploy_grid(SMALL, limits(seqs=4, chunked=True)).mixed == []


def test_fastdeploy_warmup_as_our_buckets_and_graphs():
    phases = fastdeploy_warmup(SMALL, limits(seqs=5, chunked=True))
    assert phases["prefill"][0] == ((2, 256, 2), None)  # 256 tokens, a 2-block table
    assert phases["mixed"] == [((1, 384, 3), (4, 8))]
    # the mixed run's prefill part is not a prefill run's (batch 1, 384 is: (1, 384, 3)),
    # its decode part is (4, 8): no new graph
    assert part_graphs(phases) == {"prefill": 5, "decode": 8, "mixed": 0}
    # FastDeploy's runner: the mixed pass's token-wise ops at 1 x 384 + 4 tokens, 1 + 4 rows
    assert part_graphs(phases, whole=True) == {"prefill": 5, "decode": 8, "mixed": 1}


def test_a_mixed_step_compiles_its_parts_and_its_total_tokens():
    # worked from hpu_attn_backend.py forward_mixed: attention at each part's own shape
    # (a prefill of 2 rows x 256, a decode of 8 rows); the rest at 2 x 256 + 8 = 520 tokens
    # and 2 + 8 = 10 rows
    assert step_graphs((2, 256, 4), (8, 40), whole=True) == [
        ("prefill", (2, 256, 4)), ("decode", (8, 40)), ("mixed", 520, 10)]  # fmt: skip
    assert step_graphs((2, 256, 4), (8, 40), whole=False) == [
        ("prefill", (2, 256, 4)), ("decode", (8, 40))]  # fmt: skip
    # two mixed steps that differ in their decode blocks or context share the mixed recipes
    phases = {"s": [((1, 512, 4), (4, 16)), ((1, 512, 8), (4, 32))]}
    assert part_graphs(phases, whole=True) == {"s": 2 + 2 + 1}


@pytest.mark.parametrize(
    ("rows", "padded"), [(1, 1), (2, 2), (3, 4), (5, 8), (9, 12), (17, 20), (200, 128)]
)
def test_fastdeploy_pads_a_decode_batch_as_find_bucket(rows, padded):
    # min(round up to 4, next power of two, max_batches 128)
    assert fastdeploy_decode_batch(rows, 4, 128) == padded


def test_fastdeploy_default_grid_size():
    # FastDeploy's defaults, block 128, 2048 batched tokens, 128 rows, model length 4096,
    # 4000 blocks, chunked: lengths 128..4096 by 128, b x L <= 2048 keeps L <= 2048 at
    # batch 1 (16 lengths), <= 1024 at 2 (8), <= 682 at 3 (5): 29
    grid = fastdeploy_grid(FastDeploySteps(), ServerLimits(128, 2048, 128, 4096, 4000, False, True))
    assert len(grid.prefill) == 16 + 8 + 5
    # the decode pairs recomputed independently, by their rule
    per_row = 32  # 4096 / 128
    top = min(4000, (per_row + 2) * 128)
    expected = sum(
        1
        for b in range(4, 129, 4)
        for t in range(16, top + 1, 16)
        if t >= b and -(-t // b) <= per_row
    )
    assert len(grid.decode) == expected


def test_vllm_linear_range_worked_by_hand():
    assert vllm_linear_range(2, 32, 64) == [2, 4, 8, 16, 32, 64]  # its docstring's example
    assert vllm_linear_range(1, 32, 128) == [1, 2, 4, 8, 16, 32, 64, 96, 128]
    assert vllm_linear_range(0, 1, 5) == [0, 1, 2, 3, 4, 5]  # min 0 keeps a 0 bucket


def test_vllm_exponential_range_worked_by_hand():
    # (2048/128)^(1/9) = 1.3608: 128, 174->256, 237->256, 323->384, 439->512, 597->640,
    # 813->896, 1106->1152, 1505->1536, 2048 (its docstring's example)
    assert vllm_exponential_range(128, 128, 2048, 10) == [
        128, 256, 384, 512, 640, 896, 1152, 1536, 2048
    ]  # fmt: skip
    # min 1 starts at step 2 and keeps 1: 2 x 4^(i/3) = 2, 3.17->4, 5.04->6, 8
    assert vllm_exponential_range(1, 2, 8, 4) == [1, 2, 4, 6, 8]


def test_vllm_padding_range_worked_by_hand():
    # the four examples of its docstring
    assert vllm_padding_range(0, 8, 64, 64, 0) == [0, 1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert vllm_padding_range(0, 8, 64, 64, 50) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert vllm_padding_range(0, 8, 64, 16, 50) == [0, 1, 2, 4, 8, 16, 32, 48, 64]
    assert vllm_padding_range(16, 16, 128, 32, 25) == [16, 32, 48, 64, 80, 96, 128]


def test_vllm_strategies_on_an_axis():
    axis = Axis(min=1, step=32, max=128)
    assert axis.sizes(Bucketing.vllm_lin) == [1, 2, 4, 8, 16, 32, 64, 96, 128]
    # ceil(log2 128) + 1 = 8 sizes from 32 to 128 by 2^(2/7), rounded up to 32, and 1
    assert axis.sizes(Bucketing.vllm_exp) == [1, 32, 64, 96, 128]
    # our own linear has no doubling ramp: it is not vllm-gaudi's
    assert axis.sizes(Bucketing.linear)[:3] == [1, 33, 65]


def test_metadata_bucketing_fastdeploy_warms_its_grid():
    from pipeline.schema import BucketedMetadataConf
    from stages.forward.metadata import BucketedMetadataBuilder
    from stages.scheduling.kv_cache import KVCacheManager
    from tests.helpers import schema_kwargs

    steps = {"max_prefill_num": 2, "batch_step_decode": 2, "block_step_decode": 2,
             "warmup_model_len": 384}  # fmt: skip
    given = schema_kwargs(BucketedMetadataConf, max_tokens=512, max_num_seqs=4, max_model_len=1024,
                          bucketing="fastdeploy", fastdeploy=steps)  # fmt: skip
    meta = BucketedMetadataBuilder(kv_cache=KVCacheManager(100, 128), **given)
    # the hand-worked grid above, as our (batch, seq, table blocks) and (batch, blocks)
    assert meta.warmup_shapes(mixed=False)["prefill"] == [
        ((2, 256, 2), None), ((2, 128, 1), None),
        ((1, 384, 3), None), ((1, 256, 2), None), ((1, 128, 1), None),
    ]  # fmt: skip
    assert meta.warmup_counts(mixed=False) == {"prefill": 5, "decode": 8, "mixed": 0}
    # served steps pad as FastDeploy does: 3 decode rows to 4, block lists to 2 blocks
    assert meta.buckets.fitted("decode", {"batch": 3, "blocks": 5}) == (4, 6)
