"""The metadata builder's packed layout (an attention stage that packs rows, the CPU's): the
padded layout's real tokens, found here by hand, and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.schema import BucketedMetadataConf
from stages.forward.metadata import BucketedMetadataBuilder
from stages.scheduling.kv_cache import KVCacheManager
from stages.scheduling.request import PrefillChunk, Request, StepPlan
from tests.helpers import schema_kwargs

BS, POOL = 4, 64


class GivenTables(KVCacheManager):
    """The pool, with each request's blocks given by the test rather than allocated."""

    def assign(self, request: Request, table: list[int]) -> None:
        self._tables[request.seq_id] = table


def builders() -> tuple[BucketedMetadataBuilder, BucketedMetadataBuilder, GivenTables]:
    kv = GivenTables(POOL, BS)
    given = schema_kwargs(BucketedMetadataConf, max_tokens=64, max_num_seqs=8, max_model_len=64)
    padded = BucketedMetadataBuilder(kv_cache=kv, **given)
    packed = BucketedMetadataBuilder(kv_cache=kv, packed=True, **given)
    return padded, packed, kv


def request(kv: GivenTables, i: int, length: int, first_block: int) -> Request:
    r = Request(
        id=f"r{i}", index=i, prompt="", prompt_ids=list(range(100 * i, 100 * i + length)),
        max_new_tokens=4,
    )  # fmt: skip
    kv.assign(r, list(range(first_block, first_block + -(-length // BS) + 1)))
    return r


def plan(kv: GivenTables, contexts: list[int], decodes: int) -> StepPlan:
    """Chunks of 3 and 5 tokens after the given contexts, then decode rows."""
    chunks = [
        PrefillChunk(request(kv, i, ctx + n, 8 * i), ctx, ctx + n)
        for i, (ctx, n) in enumerate(zip(contexts, [3, 5], strict=False))
    ]
    decode = [request(kv, 10 + i, 6 + i, 32 + 4 * i) for i in range(decodes)]
    return StepPlan(prefill=chunks, decode=decode)


def real_rows(meta) -> list[int]:
    """The padded step's rows that hold real tokens: each prefill row's first chunk_len of
    its seq, then the real decode rows."""
    rows: list[int] = []
    b, s, _ = meta.prefill.shape if meta.prefill else (0, 0, 0)
    if meta.prefill:
        for r, n in enumerate(meta.prefill.chunk_lens[: meta.prefill.batch].tolist()):
            rows += range(r * s, r * s + n)
    if meta.decode:
        rows += range(b * s, b * s + meta.decode.batch)
    return rows


def cache_writes(meta) -> dict[tuple[int, int], int]:
    """{(block, offset): the row of input_ids written there} of the prefill's layout."""
    p = meta.prefill
    if p.block_indices is None:
        slots = zip(p.slot_blocks.numpy().tolist(), p.slot_offsets.numpy().tolist(), strict=True)
        return {slot: row for row, slot in enumerate(slots)}
    fill = p.block_rows.numpy().tolist() if p.block_rows is not None else None
    return {
        (block, k): fill[j * BS + k] if fill is not None else j * BS + k
        for j, block in enumerate(p.block_indices.numpy().tolist())
        for k in range(BS)
    }


@pytest.mark.parametrize(
    "contexts, decodes",
    [([0, 0], 3), ([4, 8], 2), ([2, 5], 1), ([0], 0), ([], 3), ([4, 0], 0)],
    ids=["aligned mixed", "aligned with context", "unaligned", "one row", "decode", "two rows"],
)
def test_the_packed_layout_is_the_padded_ones_real_tokens(contexts, decodes):
    padded_builder, packed_builder, kv = builders()
    step = plan(kv, contexts, decodes)
    padded, packed = padded_builder.build(step), packed_builder.build(step)
    rows = real_rows(padded)
    assert packed.packed and not padded.packed
    assert padded.padded_tokens > len(rows)  # the case has padding to leave out
    assert packed.input_ids.numpy().tolist() == padded.input_ids.numpy()[rows].tolist()
    assert packed.positions.numpy().tolist() == padded.positions.numpy()[rows].tolist()
    # the logits rows pick the same tokens; the buckets and counts stay the padded step's
    picked = padded.input_ids.numpy()[padded.logits_rows.numpy()]
    assert packed.input_ids.numpy()[packed.logits_rows.numpy()].tolist() == picked.tolist()
    assert (packed.bucket, packed.padded_tokens) == (padded.bucket, padded.padded_tokens)
    assert (packed.shape.prefill, packed.shape.decode) == (
        padded.shape.prefill,
        padded.shape.decode,
    )
    if step.prefill:
        assert packed.prefill_tokens == sum(c.length for c in step.prefill)
        assert packed.prefill.mask is None  # the packed ops read contexts and lengths
        assert (packed.prefill.block_list is None) == (padded.prefill.block_list is None)
        real_ids, ids = padded.input_ids.numpy(), packed.input_ids.numpy()
        real = {
            slot: real_ids[row] for slot, row in cache_writes(padded).items() if row in set(rows)
        }
        got = {slot: ids[row] for slot, row in cache_writes(packed).items()}
        # every real token lands where the padded layout puts it; the packed layout's other
        # slots (a block's tail) hold the row's last token, masked until overwritten
        assert {slot: got[slot] for slot in real} == real
        assert padded_builder.scratch not in {block for block, _ in got}  # padding writes none
    if step.decode:
        n = len(step.decode)
        pad, pack = padded.decode, packed.decode
        assert pack.rows == n <= pad.rows
        for name in ("block_indices", "block_offsets"):
            assert getattr(pack, name).numpy().tolist() == getattr(pad, name).numpy()[:n].tolist()
        assert np.array_equal(pack.block_mapping.numpy(), pad.block_mapping.numpy()[:, :n])
        assert np.array_equal(pack.block_bias.numpy(), pad.block_bias.numpy())
        owned = pad.block_mapping.numpy().sum(axis=1) > 0  # padding blocks: any row, masked
        assert np.array_equal(pack.block_groups.numpy()[owned], pad.block_groups.numpy()[owned])


def test_warmup_steps_stay_padded():
    """A warmup step has no real token: a packing builder lays it out padded, whole."""
    _, packed_builder, _ = builders()
    meta = packed_builder.dummy((2, 8, 4), (4, 8))
    assert not meta.packed and meta.input_ids.shape == [2 * 8 + 4]
