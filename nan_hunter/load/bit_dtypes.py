"""Safetensors dtypes checked from their bits: fp8 (``F8_E4M3``: S.1111.111 is NaN, no Inf;
``F8_E5M2``: exponent 11111 is Inf or NaN), AMD's fp8 (``F8_E4M3FNUZ``, ``F8_E5M2FNUZ``: 0x80 is
NaN, no Inf), ``F8_E8M0`` (scale exponents: 0xFF is NaN) and the sub-byte floats ``F4`` (E2M1, two
per byte), ``F6_E2M3`` and ``F6_E3M2`` (four per three bytes), which have no NaN or Inf encoding.

A tensor of these dtypes is read as raw bytes, piece by piece, and reduced to a histogram of its
codes (``numpy.bincount``, a bounded slice at a time: no per-element Python). Every statistic the weights
scan reports (NaN count, absmax, fp16 underflow) follows exactly from the histogram and the value
of each code (``code_values``). The first NaN's index is searched only in a piece that holds one.

Packing of the sub-byte formats: ``F4`` holds element ``2i`` in the low nibble of byte ``i`` and
``2i + 1`` in the high nibble (as transformers' MXFP4 unpacking reads gpt-oss); ``F6`` packs four
6-bit codes into three bytes read as a little-endian 24-bit word, element ``4i + k`` in bits
``6k .. 6k + 5``. The histogram of F4 does not depend on the nibble order; that of F6 does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from ..dtypes import limits

#: safetensors tag → (bits per element, bytes per packed group, elements per group)
BIT_TAGS: dict[str, tuple[int, int, int]] = {
    "F8_E4M3": (8, 1, 1),
    "F8_E5M2": (8, 1, 1),
    "F8_E4M3FNUZ": (8, 1, 1),
    "F8_E5M2FNUZ": (8, 1, 1),
    "F8_E8M0": (8, 1, 1),
    "F4": (4, 1, 2),
    "F6_E2M3": (6, 3, 4),
    "F6_E3M2": (6, 3, 4),
}
#: torch dtype name → safetensors tag, for ``.pt`` checkpoints holding these dtypes
TORCH_TO_TAG = {
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}
CHUNK_BYTES = 1 << 20  # bytes unpacked at a time for F6 (int32 temporaries of ~4 MB)
HIST_BYTES = 1 << 20  # bytes counted at a time (bincount widens them to int64: temporaries of 8 MB)


def _minifloat(code: int, exp_bits: int, man_bits: int, bias: int) -> float:
    """Value of a sign/exponent/mantissa code with no NaN or Inf encoding (F4, F6)."""
    sign = -1.0 if code >> (exp_bits + man_bits) & 1 else 1.0
    e = code >> man_bits & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    if e == 0:
        return sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


@cache
def code_values(tag: str) -> tuple[float, ...]:
    """The value of every code of ``tag`` (NaN for NaN codes): 256 codes for 8-bit tags, 16 for
    F4, 64 for F6."""
    if tag == "F4":
        return tuple(_minifloat(c, 2, 1, 1) for c in range(16))
    if tag == "F6_E2M3":
        return tuple(_minifloat(c, 2, 3, 1) for c in range(64))
    if tag == "F6_E3M2":
        return tuple(_minifloat(c, 3, 2, 3) for c in range(64))
    if tag == "F8_E4M3":  # OCP e4m3fn: S.1111.111 is NaN, no Inf
        return tuple(math.nan if c & 0x7F == 0x7F else _minifloat(c, 4, 3, 7) for c in range(256))
    if tag == "F8_E5M2":  # IEEE-like: exponent 11111 is Inf (mantissa 0) or NaN
        return tuple(
            (math.nan if c & 3 else math.copysign(math.inf, -1.0 if c & 0x80 else 1.0))
            if c & 0x7C == 0x7C
            else _minifloat(c, 5, 2, 15)
            for c in range(256)
        )
    out = []
    for c in range(256):
        if tag == "F8_E8M0":
            out.append(math.nan if c == 0xFF else 2.0 ** (c - 127))
            continue
        if c == 0x80:
            out.append(math.nan)
            continue
        exp_bits, man_bits, bias = (4, 3, 8) if tag == "F8_E4M3FNUZ" else (5, 2, 16)
        out.append(_minifloat(c, exp_bits, man_bits, bias))
    return tuple(out)


def nan_codes(tag: str) -> tuple[int, ...]:
    """Codes that are NaN or ±Inf (the non-finite ones)."""
    return tuple(c for c, v in enumerate(code_values(tag)) if not math.isfinite(v))


@cache
def _bad_table(tag: str) -> np.ndarray:
    """bool [256]: whether each byte is a NaN/±Inf code of 8-bit ``tag``."""
    t = np.zeros(256, dtype=bool)
    t[list(nan_codes(tag))] = True
    return t


@cache
def float32_table(tag: str) -> np.ndarray:
    """float32 [codes]: the value of every code of ``tag`` (NaN codes NaN, Inf codes ±Inf); every value
    of these formats is a float32 exactly."""
    return np.array(code_values(tag), dtype=np.float32)


def byte_counts(piece: np.ndarray) -> np.ndarray:
    """int64 [256]: how many times each byte value occurs in 1-D uint8 ``piece`` (only read)."""
    out = np.zeros(256, dtype=np.int64)
    for s in range(0, piece.size, HIST_BYTES):
        out += np.bincount(piece[s : s + HIST_BYTES], minlength=256)
    return out


@dataclass
class CodeHistogram:
    """Histogram of the codes of one tensor of a bit-checked dtype, fed with raw byte pieces."""

    tag: str
    counts: list[int] = field(default_factory=list)
    first_nan: int | None = None  # flat element index of the first NaN or ±Inf

    def __post_init__(self) -> None:
        self.counts = [0] * len(code_values(self.tag))

    def add(self, first_byte: int, piece: np.ndarray) -> None:
        """Bytes ``first_byte ..`` of the tensor (a 1-D numpy uint8 view, only read; a whole number of
        groups)."""
        _, group_bytes, per_group = BIT_TAGS[self.tag]
        if self.tag == "F4":
            h = byte_counts(piece).tolist()
            for b, n in enumerate(h):
                if n:
                    self.counts[b & 0xF] += n
                    self.counts[b >> 4] += n
            return
        if group_bytes == 3:
            for s in range(0, piece.size, CHUNK_BYTES):
                g = piece[s : s + CHUNK_BYTES].reshape(-1, 3).astype(np.int32)
                w = g[:, 0] | (g[:, 1] << 8) | (g[:, 2] << 16)
                codes = np.stack([(w >> (6 * k)) & 63 for k in range(4)], axis=1)
                for c, n in enumerate(np.bincount(codes.reshape(-1), minlength=64).tolist()):
                    self.counts[c] += n
            return
        h = byte_counts(piece).tolist()
        bad = nan_codes(self.tag)
        if self.first_nan is None and any(h[c] for c in bad):
            table = _bad_table(self.tag)
            for s in range(0, piece.size, HIST_BYTES):  # the first slice holding one: argmax finds it
                hit = table[piece[s : s + HIST_BYTES]]
                if hit.any():
                    self.first_nan = first_byte + s + int(np.argmax(hit))
                    break
        for c, n in enumerate(h):
            self.counts[c] += n

    def add_zeros(self, nbytes: int) -> None:
        """A hole of a sparse file: code 0 (value 0 in every tag but E8M0, where it is 2^-127)."""
        self.counts[0] += nbytes * BIT_TAGS[self.tag][2]

    def infs(self) -> tuple[int, int]:
        """(+Inf count, -Inf count)."""
        vals = code_values(self.tag)
        return (
            sum(n for v, n in zip(vals, self.counts) if v == math.inf),
            sum(n for v, n in zip(vals, self.counts) if v == -math.inf),
        )

    def stats(self) -> tuple[int, float | None, int, int, int, float | None]:
        """(NaN count, absmax over finite values, finite count, flushed to 0 in fp16, fp16 subnormal,
        min |x| > 0)."""

        fp16 = limits("fp16")
        half_sub, normal = fp16.smallest_subnormal / 2, fp16.smallest_normal
        nan = finite = flush = sub = 0
        absmax: float | None = None
        mn = math.inf
        for v, n in zip(code_values(self.tag), self.counts):
            if not n:
                continue
            if math.isnan(v):
                nan += n
                continue
            if math.isinf(v):
                continue
            a = abs(v)
            finite += n
            absmax = a if absmax is None else max(absmax, a)
            if a > 0:
                mn = min(mn, a)
                if a < half_sub:
                    flush += n
                elif a < normal:
                    sub += n
        return nan, absmax, finite, flush, sub, (mn if mn < math.inf else None)
