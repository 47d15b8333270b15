"""Which rows of a padded step the CPU forward runs its dense layers on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from stages.attention import ops_cpu
from stages.attention.hpu import PagedAttention


def step(chunk_lens: list[int], rows: int, seq: int, decodes: int, decode_rows: int):
    """A ForwardMeta's fields that packed_rows reads: prefill rows padded to rows x seq,
    then decode rows padded to decode_rows."""
    lens = np.array(chunk_lens + [0] * (rows - len(chunk_lens)), dtype=np.int64)
    prefill = SimpleNamespace(batch=len(chunk_lens), shape=(rows, seq, 4), chunk_lens=lens)
    decode = SimpleNamespace(batch=decodes, shape=(decode_rows, 8)) if decode_rows else None
    return SimpleNamespace(
        prefill=prefill if rows else None,
        decode=decode,
        num_tokens=sum(chunk_lens) + decodes,
        padded_tokens=rows * seq + decode_rows,
    )


def packed(meta):
    return PagedAttention.packed_rows(SimpleNamespace(ops=ops_cpu), meta)


def test_real_tokens_and_logits_rows_of_a_mixed_step():
    # Rows 0-7 hold 3 real tokens, rows 8-15 hold 5, rows 16-23 are a padding row; then
    # decode rows 24-27, of which 24-26 are real.
    got = packed(step([3, 5], rows=3, seq=8, decodes=3, decode_rows=4))
    assert got.tokens.numpy().tolist() == [0, 1, 2, 8, 9, 10, 11, 12, 24, 25, 26]
    assert got.logits_rows.numpy().tolist() == [2, 7, 8, 9, 10]
    assert got.prefill_tokens == 8


def test_decode_only_step_with_padding_rows():
    got = packed(step([], rows=0, seq=0, decodes=2, decode_rows=4))
    assert got.tokens.numpy().tolist() == [0, 1]
    assert got.logits_rows.numpy().tolist() == [0, 1] and got.prefill_tokens == 0


def test_no_packing_without_padding_or_without_real_tokens():
    assert packed(step([8, 8], rows=2, seq=8, decodes=1, decode_rows=1)) is None
    assert packed(step([], rows=2, seq=8, decodes=0, decode_rows=0)) is None  # warmup
    no_packing = SimpleNamespace(ops=SimpleNamespace(packs_rows=False))  # the HPU's ops
    assert PagedAttention.packed_rows(no_packing, step([3], 1, 8, 0, 0)) is None
