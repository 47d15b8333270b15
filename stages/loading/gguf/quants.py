"""ggml's weight formats decoded to float32 in numpy: F32, F16, BF16, Q8_0, Q4_0, Q4_1 and
the K-quants Q4_K, Q5_K, Q6_K.

Each quantised format stores a row as blocks: a block of 32 (or 256 for K-quants) values is
float16 scale(s) and packed integers. The layouts follow ggml's block_q* structs
(ggml-common.h) and their dequantize_row_* functions (ggml-quants.c): a value is
scale * q (- min) per block or per 32- / 16-value sub-block. `dequantize` takes whole blocks
of bytes and returns their values, block by block, in order.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
K_BLOCK = 256


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of each block, as a float32 column [blocks, 1]."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """Bytes [blocks, n] as 2n values: every low nibble first, then every high one."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _q8_0(blocks: np.ndarray) -> np.ndarray:  # d, qs[32] int8
    return _f16(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(blocks: np.ndarray) -> np.ndarray:  # d, qs[16]: (q - 8) * d
    return _f16(blocks, 0) * (_nibbles(blocks[:, 2:]).astype(np.float32) - 8.0)


def _q4_1(blocks: np.ndarray) -> np.ndarray:  # d, m, qs[16]: q * d + m
    return _f16(blocks, 0) * _nibbles(blocks[:, 4:]).astype(np.float32) + _f16(blocks, 2)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins, eight each ([blocks, 8] both):
    sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7
    in the nibbles of bytes 8-11 with their top 2 bits in the top bits of bytes 0-7."""
    low, high, top = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 63, (top & 0x0F) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([high & 63, (top >> 4) | ((high >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_values(quants: np.ndarray, d, dmin, scales, mins) -> np.ndarray:
    """Values of 8 sub-blocks of 32: d * scale * q - dmin * min. quants [blocks, 8, 32]."""
    sub_scale = (d * scales)[:, :, None]
    sub_min = (dmin * mins)[:, :, None]
    return (sub_scale * quants - sub_min).reshape(len(quants), K_BLOCK)


def _q4_k(blocks: np.ndarray) -> np.ndarray:  # d, dmin, scales[12], qs[128]
    qs = blocks[:, 16:144].reshape(-1, 4, 32)  # four runs of 32 bytes: sub-blocks 2j, 2j+1
    quants = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    scales, mins = _k_scales(blocks[:, 4:16])
    return _k_values(quants, _f16(blocks, 0), _f16(blocks, 2), scales, mins)


def _q5_k(blocks: np.ndarray) -> np.ndarray:  # d, dmin, scales[12], qh[32], qs[128]
    qh = blocks[:, 16:48]
    qs = blocks[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    # Sub-block i's fifth bits are bit i of the 32 qh bytes.
    bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    quants = (low | (bits << 4)).astype(np.float32)
    scales, mins = _k_scales(blocks[:, 4:16])
    return _k_values(quants, _f16(blocks, 0), _f16(blocks, 2), scales, mins)


def _q6_k(blocks: np.ndarray) -> np.ndarray:  # ql[128], qh[64], scales[16] int8, d
    n = len(blocks)
    ql = blocks[:, 0:128].reshape(n, 2, 2, 32)  # [half, low/high 32 bytes, 32]
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)  # [half, 32]
    # Within each half of 128 values, quarter k takes ql's nibbles (quarters 0-1 the low
    # nibbles of the two 32-byte runs, 2-3 the high ones) and qh's bits 2k, 2k+1.
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [n, half, 4 quarters, 32]
    shifts = np.arange(0, 8, 2, dtype=np.uint8)[None, None, :, None]
    high = (qh >> shifts) & 3
    quants = ((low | (high << 4)).astype(np.int8) - 32).astype(np.float32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)  # one per 16 values
    d = _f16(blocks, 208)
    values = quants.reshape(n, 16, 16) * (d * scales)[:, :, None]
    return values.reshape(n, K_BLOCK)


def _f32(blocks: np.ndarray) -> np.ndarray:
    return blocks.reshape(-1).view(np.float32).copy()


def _f16_values(blocks: np.ndarray) -> np.ndarray:
    return blocks.reshape(-1).view(np.float16).astype(np.float32)


def _bf16(blocks: np.ndarray) -> np.ndarray:  # the top half of a float32
    wide = blocks.reshape(-1).view(np.uint16).astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


_DECODERS = {
    Q.F32: _f32,
    Q.F16: _f16_values,
    Q.BF16: _bf16,
    Q.Q8_0: _q8_0,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
SUPPORTED_TYPES = tuple(_DECODERS)


def dequantize(raw: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """The float32 values held by `raw` (uint8, whole blocks of `kind`), flat, in order."""
    if kind not in _DECODERS:
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"tensor type {kind.name} is not supported: supported are {names}")
    _, block_bytes = GGML_QUANT_SIZES[kind]
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, block_bytes)
    return _DECODERS[kind](blocks).reshape(-1)
