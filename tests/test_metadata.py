"""The decoder's block layouts: listed row by row, or one span of the pool read in place."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.schema import BucketedMetadataConf
from stages.forward.metadata import BucketedMetadataBuilder, ShapeMetadataBuilder
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import Request, StepPlan
from tests.helpers import schema_kwargs

BS, POOL = 16, 40


class GivenTables(KVCacheManager):
    """The pool, with each request's blocks given by the test rather than allocated."""

    def assign(self, request: Request, table: list[int]) -> None:
        self._tables[request.seq_id] = table


KV = GivenTables(POOL, BS)


def builder(
    decode_span: float, blocks_step: int = 1, shapes_only: bool = False
) -> BucketedMetadataBuilder:
    axis = {"min": 0, "step": 0, "max": 0}
    given = schema_kwargs(
        BucketedMetadataConf,
        max_tokens=64,
        max_num_seqs=8,
        max_model_len=256,
        prefill_batch=axis,
        prefill_seq=axis,
        prefill_blocks=axis,
        decode_batch=axis,
        decode_blocks={"min": 1, "step": blocks_step, "max": 0},
        decode_span=decode_span,
    )
    kind = ShapeMetadataBuilder if shapes_only else BucketedMetadataBuilder
    return kind(kv_cache=KV, **given)


def decoding(tables: list[list[int]], lengths: list[int]) -> list[Request]:
    """Requests with `length` tokens cached (the last one this step's input)."""
    requests = []
    for i, (table, length) in enumerate(zip(tables, lengths, strict=True)):
        r = Request(id=f"r{i}", index=i, prompt="", prompt_ids=[1] * length, max_new_tokens=4)
        KV.assign(r, table)
        requests.append(r)
    return requests


TABLES = [[4, 7], [5], [6, 9, 10]]  # rows interleave in blocks 4..10; block 8 is another's
LENGTHS = [20, 3, 40]


def check_rows(meta, start: int | None) -> None:
    """Every row block sits at its place, owned, and unmasked exactly over its tokens,
    its row slot its row's stretch of 3 blocks (the widest row's) plus its index in the
    row; every other entry is masked padding mapped to no row, slotted in the spare row."""
    dec = meta.decode
    block_list, groups = dec.block_list.numpy(), dec.block_groups.numpy()
    mapping, bias = dec.block_mapping.numpy(), dec.block_bias.numpy()
    row_slots = dec.row_slots.numpy()
    assert dec.row_width == 3
    seen = set()
    for row, (table, length) in enumerate(zip(TABLES, LENGTHS, strict=True)):
        for j, block in enumerate(table):
            (slot,) = np.flatnonzero(block_list == block) if start is None else [block - start]
            assert block_list[slot] == block and groups[slot] == row
            assert mapping[slot].tolist() == [
                1.0 if r == row else 0.0 for r in range(len(mapping[0]))
            ]
            visible = min(BS, length - j * BS)
            assert (bias[slot, :visible] == 0).all() and (bias[slot, visible:] < -1e29).all()
            assert row_slots[slot] == row * 3 + j
            seen.add(int(slot))
    others = [s for s in range(len(block_list)) if s not in seen]
    assert (mapping[others] == 0).all() and (bias[others] < -1e29).all()
    assert (row_slots[others] == dec.shape[0] * 3).all()
    assert dec.block_indices.numpy()[:3].tolist() == [t[-1] for t in TABLES]


def test_a_compact_step_reads_one_span_with_the_other_blocks_masked():
    meta = builder(decode_span=2.0).build(StepPlan(decode=decoding(TABLES, LENGTHS)))
    first, end = meta.decode.block_range
    assert first <= 4 and end >= 11 and end <= POOL + 1
    assert meta.decode.block_list.numpy().tolist() == list(range(first, end))
    check_rows(meta, first)


@pytest.mark.parametrize("decode_span", [0.0, 1.0])
def test_rows_are_listed_when_the_span_is_off_or_too_wide(decode_span):
    meta = builder(decode_span).build(StepPlan(decode=decoding(TABLES, LENGTHS)))
    assert meta.decode.block_range is None
    listed = meta.decode.block_list.numpy().tolist()
    assert listed[:6] == [b for t in TABLES for b in t]
    assert meta.decode.block_groups.numpy().tolist()[:6] == [0, 0, 1, 2, 2, 2]
    check_rows(meta, None)


def test_a_span_near_the_pool_end_shifts_down_to_stay_inside():
    tables = [[POOL - 1], [POOL - 3]]
    meta = builder(decode_span=8.0, blocks_step=8).build(StepPlan(decode=decoding(tables, [5, 9])))
    first, end = meta.decode.block_range
    assert meta.decode.shape[1] == end - first == 9  # 3 blocks padded to the bucket of 9
    assert end == POOL + 1 and first == POOL + 1 - 9  # shifted down, the scratch block last


def test_a_shapes_only_step_carries_its_decode_rows_kv_slots_and_blocks():
    """What a device reads instead of the rows: their tokens (each with its new one) and
    the blocks those fill, by hand."""
    meta = builder(0.0, shapes_only=True).build(StepPlan(decode=decoding(TABLES, LENGTHS)))
    assert meta.shape.decode_lens.tolist() == LENGTHS
    assert meta.shape.decode_kv == (20 + 3 + 40, 2 + 1 + 3)
