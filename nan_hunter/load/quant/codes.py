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
from typing import TYPE_CHECKING

from ..bit_dtypes import code_values

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: fp8 magnitude codes (``b & 0x7F``) from which on a code is NaN/Inf: left out of block maxima
#: (the plain scan reports them)
FP8_BAD_MAG = {"F8_E4M3": 0x7F, "F8_E5M2": 0x7C}


@cache
def fp8_mag_table(tag: str) -> torch.Tensor:
    """float32 [128]: |value| of each magnitude code ``b & 0x7F`` (0 for NaN/Inf codes)."""
    import torch

    vals = code_values(tag)
    return torch.tensor([abs(v) if math.isfinite(v) else 0.0 for v in vals[:128]], dtype=torch.float32)


@cache
def fp4_mag_table() -> torch.Tensor:
    import torch

    return torch.tensor([abs(v) for v in code_values("F4")[:8]], dtype=torch.float32)


def fp8_block_mags(tag: str, m, br: int, bc: int):
    """Largest |value| per block of fp8 bytes ``m`` ``[rows, cols]`` (uint8), blocks of ``br`` rows and
    ``bc`` columns (a last partial block is padded with zeros): float32 ``[ceil(rows/br), ceil(cols/bc)]``.
    The rows of a block are reduced first (an element-wise max along the row), then its columns."""
    import torch

    mag = m & 0x7F
    if tag in ("F8_E4M3FNUZ", "F8_E5M2FNUZ"):
        mag = torch.where(m == 0x80, 0, mag)  # 0x80 is NaN there (magnitude 0 otherwise)
    bad = FP8_BAD_MAG.get(tag)
    if bad is not None:
        mag = torch.where(mag >= bad, 0, mag)
    codes = reduce_blocks(mag, br, bc)
    return fp8_mag_table(tag)[codes.long()]


def reduce_blocks(m, br: int, bc: int):
    """amax of ``m`` ``[rows, cols]`` over blocks of ``br`` rows x ``bc`` columns (zero padding)."""
    import torch

    rows, cols = m.shape
    k = -(-rows // br)
    if k * br != rows:
        m = torch.nn.functional.pad(m, (0, 0, 0, k * br - rows))
    r = m.reshape(k, br, cols).amax(dim=1) if br > 1 else m
    nb = -(-cols // bc)
    if nb * bc != cols:
        r = torch.nn.functional.pad(r, (0, nb * bc - cols))
    return r.reshape(k, nb, bc).amax(dim=-1) if bc > 1 else r


def fp4_pair_mags(m, bc: int):
    """fp4 E2M1 packed two per byte, ``m`` ``[rows, bytes]``: largest |value| per block of ``bc`` values."""
    import torch

    mag = torch.maximum(m & 0x7, (m >> 4) & 0x7)
    return fp4_mag_table()[reduce_blocks(mag, 1, max(1, bc // 2)).long()]


def unpack_bits(words, bits: int):
    """int32 ``[r, w]`` → unsigned ``bits``-bit codes ``[r, w * 32 // bits]`` (int32), the little-endian
    bit stream of each row."""
    import torch

    r, w = words.shape
    if bits in (1, 2, 4, 8, 16):
        per = 32 // bits
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)
        out = (words.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
        return out.reshape(r, w * per)
    b = words.contiguous().view(torch.uint8).reshape(r, w * 4)
    stream = ((b.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(r, -1)
    n = stream.shape[1] // bits
    weights = 1 << torch.arange(bits, dtype=torch.int32)
    return (stream[:, : n * bits].reshape(r, n, bits).to(torch.int32) * weights).sum(-1)


def decode_f16(raw):
    """float32 of little-endian fp16 fields: ``raw`` uint8 ``[..., 2]`` (any strides)."""
    import torch

    return raw.contiguous().view(torch.float16).to(torch.float32).squeeze(-1)


def decode_f32(raw):
    import torch

    return raw.contiguous().view(torch.float32).squeeze(-1)


def decode_e8m0(raw):
    """float32 of E8M0 exponent bytes: 2**(b - 127), 0xFF is NaN."""
    import torch

    x = torch.pow(2.0, raw.to(torch.float32) - 127)
    return torch.where(raw == 0xFF, math.nan, x)
