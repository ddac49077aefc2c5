"""Codes from raw bytes, vectorised: fp8 and fp4 magnitudes, packed integers.

fp8 and fp4 are sign-magnitude: ``b & 0x7F`` (``& 0x7`` for a nibble) orders codes like their
absolute values, so a block's largest magnitude is the value of its largest magnitude code.
Packed integers (compressed-tensors, GPTQ 2/3/4/8-bit, AWQ) are little-endian bit streams: element
``i`` of a row of words sits at bits ``i*bits .. i*bits + bits - 1`` counting from bit 0 of the first
word (GPTQ's 3-bit "10 | 1 | 10 | 1 | 10" packing of 32 values in 3 words is exactly that stream).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from ..bit_dtypes import code_values

#: fp8 magnitude codes (``b & 0x7F``) from which on a code is NaN/Inf: left out of block maxima
#: (the plain scan reports them)
FP8_BAD_MAG = {"F8_E4M3": 0x7F, "F8_E5M2": 0x7C}


@cache
def fp8_mag_table(tag: str) -> np.ndarray:
    """float32 [128]: |value| of each magnitude code ``b & 0x7F`` (0 for NaN/Inf codes)."""
    vals = code_values(tag)
    return np.array([abs(v) if math.isfinite(v) else 0.0 for v in vals[:128]], dtype=np.float32)


@cache
def fp4_mag_table() -> np.ndarray:
    return np.array([abs(v) for v in code_values("F4")[:8]], dtype=np.float32)


def fp8_block_mags(tag: str, m: np.ndarray, br: int, bc: int) -> np.ndarray:
    """Largest |value| per block of fp8 bytes ``m`` ``[rows, cols]`` (uint8), blocks of ``br`` rows and
    ``bc`` columns (a last partial block is padded with zeros): float32 ``[ceil(rows/br), ceil(cols/bc)]``.
    The rows of a block are reduced first (an element-wise max along the row), then its columns."""
    mag = m & 0x7F
    if tag in ("F8_E4M3FNUZ", "F8_E5M2FNUZ"):
        mag = np.where(m == 0x80, 0, mag)  # 0x80 is NaN there (magnitude 0 otherwise)
    bad = FP8_BAD_MAG.get(tag)
    if bad is not None:
        mag = np.where(mag >= bad, 0, mag)
    codes = reduce_blocks(mag, br, bc)
    return fp8_mag_table(tag)[codes.astype(np.int64)]


def reduce_blocks(m: np.ndarray, br: int, bc: int) -> np.ndarray:
    """amax of ``m`` ``[rows, cols]`` over blocks of ``br`` rows x ``bc`` columns (zero padding)."""
    rows, cols = m.shape
    k = -(-rows // br)
    if k * br != rows:
        m = np.pad(m, ((0, k * br - rows), (0, 0)))
    r = m.reshape(k, br, cols).max(axis=1) if br > 1 else m
    nb = -(-cols // bc)
    if nb * bc != cols:
        r = np.pad(r, ((0, 0), (0, nb * bc - cols)))
    return r.reshape(k, nb, bc).max(axis=-1) if bc > 1 else r


def unpack_bits(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 ``[r, w]`` → unsigned ``bits``-bit codes ``[r, w * 32 // bits]`` (int32), the little-endian
    bit stream of each row."""
    r, w = words.shape
    if bits in (1, 2, 4, 8, 16):
        per = 32 // bits
        shifts = np.arange(0, 32, bits, dtype=np.int32)
        out = (words.astype(np.int32)[..., None] >> shifts) & ((1 << bits) - 1)
        return out.reshape(r, w * per)
    b = np.ascontiguousarray(words).view(np.uint8).reshape(r, w * 4)
    stream = ((b[..., None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(r, -1)
    n = stream.shape[1] // bits
    weights = np.left_shift(1, np.arange(bits, dtype=np.int32))
    codes: np.ndarray = (stream[:, : n * bits].reshape(r, n, bits).astype(np.int32) * weights).sum(
        -1, dtype=np.int32
    )
    return codes
