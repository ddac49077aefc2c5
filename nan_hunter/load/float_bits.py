"""Floating-point tensors read from their bits with numpy: F64, F32, F16 and BF16 (which numpy has no
dtype for) by one rule.

A float is sign | exponent | mantissa. Its magnitude bits (``bits & ~sign``) order like its absolute
value, the all-ones exponent with a zero mantissa is ±Inf and anything above it NaN. So over a piece
of raw bits, the largest magnitude of the positive values is the signed integer max (when it is not
negative) and that of the negative values the unsigned max minus the sign bit (when it reaches the
sign bit): two integer reductions, no temporary, no float arithmetic, and a piece holds NaN/±Inf
exactly when that largest magnitude reaches Inf's bits. Counting NaN, +Inf and −Inf, the first bad
index and the absmax of the finite values is done on ``CHUNK``-element slices of a piece that holds one.

Pieces come as unsigned integer views (``safetensors_header.NUMPY_DTYPES``: BF16 as uint16; F64,
F32 and F16 are viewed as uint64/uint32/uint16 here); nothing here writes to a piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: elements reduced at a time by ``top_magnitude``: both reductions of a slice read it from cache
CACHE_BYTES = 256 << 10
CHUNK = 1 << 18  # elements per slice of the exact count (temporaries of ~1 MB per bool/int mask)


@dataclass(frozen=True)
class FloatBits:
    """The bit layout of one float tag."""

    tag: str
    width: int  # bits
    exp_bits: int
    man_bits: int
    float_dtype: str | None  # numpy's own dtype for the values (None: BF16, decoded through float32)

    @cached_property
    def unsigned(self) -> np.dtype:
        return np.dtype(f"<u{self.width // 8}")

    @cached_property
    def signed(self) -> np.dtype:
        return np.dtype(f"<i{self.width // 8}")

    @property
    def sign(self) -> int:
        return 1 << (self.width - 1)

    @property
    def mag_mask(self) -> int:
        return self.sign - 1

    @property
    def inf(self) -> int:
        """The magnitude bits of Inf (every magnitude above is NaN)."""
        return ((1 << self.exp_bits) - 1) << self.man_bits

    def bits(self, piece: np.ndarray) -> np.ndarray:
        """``piece`` (the tag's numpy dtype, or its unsigned bits) as unsigned bits: a view, no copy."""
        return piece if piece.dtype == self.unsigned else piece.view(self.unsigned)

    def value(self, magnitude: int) -> float:
        """The (non-negative) value of magnitude bits ``magnitude``, exactly."""
        if self.float_dtype is None:  # BF16: the top half of a float32
            return float(np.array([magnitude << 16], dtype=np.uint32).view(np.float32)[0])
        return float(np.array([magnitude], dtype=self.unsigned).view(self.float_dtype)[0])

    def float32(self, bits: np.ndarray) -> np.ndarray:
        """The values of unsigned bits ``bits`` as float32 (exact for F32, F16 and BF16; F64 rounded to
        nearest, as a cast rounds it)."""
        if self.float_dtype is None:
            return (bits.astype(np.uint32) << 16).view(np.float32)
        v = bits.view(self.float_dtype)
        return v if self.float_dtype == "<f4" else v.astype(np.float32)


FLOATS: dict[str, FloatBits] = {
    "F64": FloatBits("F64", 64, 11, 52, "<f8"),
    "F32": FloatBits("F32", 32, 8, 23, "<f4"),
    "F16": FloatBits("F16", 16, 5, 10, "<f2"),
    "BF16": FloatBits("BF16", 16, 8, 7, None),
}


def top_magnitude(fb: FloatBits, bits: np.ndarray) -> int:
    """The largest magnitude bits in 1-D unsigned ``bits`` (-1 when empty): NaN/±Inf included, so the
    piece is all-finite exactly when the answer is below ``fb.inf``."""
    signed = bits.view(fb.signed)
    step = max(1, CACHE_BYTES // bits.itemsize)
    top = -1
    sign = fb.sign
    for s in range(0, bits.size, step):
        hi = int(signed[s : s + step].max())  # largest positive magnitude, when >= 0
        u = int(bits[s : s + step].max())  # sign bit + largest negative magnitude, when >= sign
        top = max(top, hi, u - sign if u >= sign else -1)
    return top


def exact_counts(fb: FloatBits, bits: np.ndarray) -> tuple[int, int, int, int | None, int]:
    """(NaN, +Inf, −Inf, flat index of the first of them or None, largest finite magnitude bits (0 when
    none is finite)) of 1-D unsigned ``bits``, ``CHUNK`` elements at a time."""
    nan = posinf = neginf = 0
    first: int | None = None
    best = 0
    mask, inf, sign = fb.mag_mask, fb.inf, fb.sign
    for s in range(0, bits.size, CHUNK):
        c = bits[s : s + CHUNK]
        top = top_magnitude(fb, c)
        if top < inf:  # a finite slice: its top magnitude is its absmax
            best = max(best, top)
            continue
        mag = c & np.array(mask, dtype=fb.unsigned)
        is_inf = mag == inf
        n_inf = int(np.count_nonzero(is_inf))
        n_pos = int(np.count_nonzero(is_inf & (c < sign)))
        bad = mag >= inf
        nan += int(np.count_nonzero(bad)) - n_inf
        posinf += n_pos
        neginf += n_inf - n_pos
        if first is None:
            first = s + int(np.argmax(bad))
        finite = np.where(bad, 0, mag)
        if finite.size:
            best = max(best, int(finite.max()))
    return nan, posinf, neginf, first, best
