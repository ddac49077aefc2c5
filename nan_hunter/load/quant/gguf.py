"""``gguf:<TYPE>``: llama.cpp's block-quantized tensors, block layouts as ggml defines them (``ggml-common.h``;
the dequantization as gguf-py's ``quants.py`` writes it, which the tests compare with).

Every block's ``d`` (and ``dmin``/``m`` where the type has one) is judged: NaN or Inf is bad; a zero
``d`` on a block holding data (some code differs from the type's zero point) is bad. A negative ``d``
is ggml's convention in several types (Q4_0 and Q6_K store ``max / -8`` and ``-1 / iscale``): not
listed. The dequantized absmax is exact for the legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the
K-quants (Q2_K ... Q6_K), IQ4_NL, IQ4_XS, TQ2_0 and MXFP4, read block by block where the bound
``|d| * max code (+ |dmin| * max min)`` could make it the largest; for the grid I-quants (IQ2_*, IQ3_*,
IQ1_S), TQ1_0 and Q1_0 only ``d`` is judged and an upper bound rules overflow out (``dequant_absmax``
null). Types whose scales are not fp16 fields (IQ1_M, NVFP4) and the intermediate Q8_1/Q8_K are
listed in ``weights.unchecked``.

Block indices are ``[row..., block]``: the tensor's dims in numpy order (GGUF stores them fastest
first), the last one counted in blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..gguf_file import ggml_type
from .base import Blocks, Context, QuantizedWeight, e8m0_values, unravel

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

STRIPE_BLOCKS = 2048
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


F32 = np.float32
_U8 = np.uint8


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, off : off + 2]).view("<f2").astype(F32).reshape(-1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes ``[n, k]`` → ``[n, 2k]``: low nibbles first, then high nibbles (ggml's order in a run)."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int32)


def _bits(b: np.ndarray, n: int) -> np.ndarray:
    """Bytes ``[blocks, k]`` → bits ``[blocks, n]``, LSB first."""
    return ((b[..., None] >> np.arange(8, dtype=_U8)) & 1).reshape(b.shape[0], -1)[:, :n].astype(np.int32)


def _shifted(x: np.ndarray, shifts: list[int], shape: tuple[int, ...]) -> np.ndarray:
    """``x`` (uint8) shifted right by each of ``shifts`` along a new axis (``shape`` places it)."""
    return x >> np.array(shifts, dtype=_U8).reshape(shape)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes → 8 six-bit scales and 8 six-bit mins."""
    s = sc.reshape(-1, 3, 4).astype(np.int32)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scale = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return scale.astype(F32), mins.astype(F32)


#: (blocks uint8 [n, size], d [n], dmin [n]) -> values [n, elements]: a dequantization or a bound
Dequant = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


# each dequant: (blocks uint8 [n, size], d [n], dmin [n]) -> values [n, elements], float32 throughout
# (an integer operand is made float32 first: every step rounds as ggml's float arithmetic does)


def _q4_0(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    return d[:, None] * (_nibbles(b[:, 2:18]) - 8).astype(F32)


def _q4_1(b: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    return d[:, None] * _nibbles(b[:, 4:20]).astype(F32) + m[:, None]


def _q5(b: np.ndarray, off: int, d: np.ndarray | None) -> np.ndarray:
    qh = _bits(b[:, off : off + 4], 32)
    return _nibbles(b[:, off + 4 : off + 20]) | (qh << 4) if d is not None else np.empty(0)


def _q5_0(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    return d[:, None] * (_q5(b, 2, d) - 16).astype(F32)


def _q5_1(b: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    return d[:, None] * _q5(b, 4, d).astype(F32) + m[:, None]


def _q8_0(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    return d[:, None] * np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(F32)


def _q2_k(b: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sc = b[:, :16].astype(np.int32)
    q = _shifted(b[:, 16:80].reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3
    q = q.reshape(n, 16, 16).astype(F32)
    return (
        (d[:, None] * (sc & 15).astype(F32))[:, :, None] * q
        - (m[:, None] * (sc >> 4).astype(F32))[:, :, None]
    ).reshape(n, 256)


def _q3_k(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    hmask, qs, scales = b[:, :32], b[:, 32:96], b[:, 96:108]
    lo = _shifted(scales[:, :8].reshape(n, 1, 8), [0, 4], (1, 2, 1)).reshape(n, 16)
    hi = _shifted(scales[:, 8:12].reshape(n, 1, 4), [0, 2, 4, 6], (1, 4, 1)).reshape(n, 16)
    s = (((lo & 15) | ((hi & 3) << 4)).astype(np.int32) - 32).astype(F32)
    ql = _shifted(qs.reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=_U8).reshape(1, 1, 8, 1)).reshape(n, 16, 16) & 1
    q = ql.astype(np.int32) - ((qh ^ 1).astype(np.int32) << 2)
    return ((d[:, None] * s)[:, :, None] * q.astype(F32)).reshape(n, 256)


def _q4_k(b: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    q = _shifted(b[:, 16:144].reshape(n, 4, 1, 32), [0, 4], (1, 1, 2, 1)) & 15
    q = q.reshape(n, 8, 32).astype(F32)
    return ((d[:, None] * sc)[:, :, None] * q - (m[:, None] * mn)[:, :, None]).reshape(n, 256)


def _q5_k(b: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    ql = _shifted(b[:, 48:176].reshape(n, 4, 1, 32), [0, 4], (1, 1, 2, 1)) & 15
    qh = (b[:, 16:48].reshape(n, 1, 1, 32) >> np.arange(8, dtype=_U8).reshape(1, 1, 8, 1)) & 1
    q = (ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)).astype(F32)
    return ((d[:, None] * sc)[:, :, None] * q - (m[:, None] * mn)[:, :, None]).reshape(n, 256)


def _q6_k(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(F32)
    ql = _shifted(b[:, :128].reshape(n, 2, 1, 64), [0, 4], (1, 1, 2, 1)) & 15
    qh = _shifted(b[:, 128:192].reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3
    q = (ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)).astype(np.int32) - 32
    return ((d[:, None] * sc)[:, :, None] * q.reshape(n, 16, 16).astype(F32)).reshape(n, 256)


_IQ4 = np.array(IQ4_VALUES, dtype=F32)
_MXFP4 = np.array(MXFP4_VALUES, dtype=F32)


def _iq4_nl(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    return d[:, None] * _IQ4[_nibbles(b[:, 2:18])]


def _iq4_xs(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sh = np.ascontiguousarray(b[:, 2:4]).view("<i2").astype(np.int32).reshape(n, 1) & 0xFFFF
    sl = b[:, 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
    dl = d[:, None] * (ls - 32).astype(F32)
    q = _nibbles(b[:, 8:136].reshape(n * 8, 16)).reshape(n, 8, 32)
    return (dl[:, :, None] * _IQ4[q]).reshape(n, 256)


def _tq2_0(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    q = _shifted(b[:, :64].reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3
    return d[:, None] * (q.reshape(n, 256).astype(F32) - 1)


def _mxfp4(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    return d[:, None] * _MXFP4[_nibbles(b[:, 1:17])]


@dataclass(frozen=True)
class Kind:
    d: tuple[int, str]  # (byte offset, "f16" | "e8m0_half")
    m: int | None  # byte offset of an fp16 dmin / m, if any
    bound: Dequant  # (blocks, d, m) -> upper bound of each block's max |value| (its sub-scales read)
    dequant: Dequant | None  # None: d judged, absmax by the bound only
    zero_is_code: bool = True  # "holds data" from the codes (dequant with d=1, m=0); else any non-d byte


def _ends(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Largest |value| of a sub-block whose values run linearly from ``lo`` (code 0) to ``hi`` (top code)."""
    return np.maximum(np.abs(lo), np.abs(hi)).max(axis=1)


def _k_bound(qmax: int) -> Dequant:
    def bound(
        b: np.ndarray, d: np.ndarray, m: np.ndarray
    ) -> np.ndarray:  # w = d*sc*q - m*mn, q in 0..qmax: the extremes sit at q = 0 and q = qmax
        s = b[:, 4:16]  # the 6-bit scales and mins decoded in uint8 (no int32 copies, no concatenation)
        lo, mi, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
        sc = np.stack([lo & 63, (hi & 15) | ((lo >> 2) & 48)], axis=1).reshape(-1, 8).astype(F32)
        mn = np.stack([mi & 63, (hi >> 4) | ((mi >> 2) & 48)], axis=1).reshape(-1, 8).astype(F32)
        low = np.multiply(mn, m[:, None], out=mn)  # = m * mn, the magnitude at q = 0
        top = np.abs(np.subtract(np.multiply(sc, d[:, None] * qmax, out=sc), low, out=sc), out=sc)
        return np.maximum(top, np.abs(low)).max(axis=1)

    return bound


def _q2_k_bound(b: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    sc = b[:, :16].astype(F32)
    low = -(m[:, None] * np.floor(sc / 16))
    return _ends(low, d[:, None] * np.remainder(sc, 16) * 3 + low)


def _q3_k_bound(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scales = b[:, 96:108]
    lo = _shifted(scales[:, :8].reshape(n, 1, 8), [0, 4], (1, 2, 1)).reshape(n, 16)
    hi = _shifted(scales[:, 8:12].reshape(n, 1, 4), [0, 2, 4, 6], (1, 4, 1)).reshape(n, 16)
    sc = np.abs(((lo & 15) | ((hi & 3) << 4)).astype(np.int32) - 32).max(axis=1).astype(F32)
    return np.abs(d) * sc * 4


def _q6_k_bound(b: np.ndarray, d: np.ndarray, _m: np.ndarray) -> np.ndarray:
    return (
        np.abs(d)
        * np.abs(np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.int32)).max(axis=1).astype(F32)
        * 32
    )


def _const(k: float) -> Dequant:
    return lambda b, d, m: np.abs(d) * k


def max_abs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(a), np.abs(b))


KINDS: dict[str, Kind] = {
    "Q4_0": Kind((0, "f16"), None, _const(8), _q4_0),
    "Q4_1": Kind((0, "f16"), 2, lambda b, d, m: max_abs(m, d * 15 + m), _q4_1),
    "Q5_0": Kind((0, "f16"), None, _const(16), _q5_0),
    "Q5_1": Kind((0, "f16"), 2, lambda b, d, m: max_abs(m, d * 31 + m), _q5_1),
    "Q8_0": Kind((0, "f16"), None, _const(128), _q8_0),
    "Q2_K": Kind((80, "f16"), 82, _q2_k_bound, _q2_k),
    "Q3_K": Kind((108, "f16"), None, _q3_k_bound, _q3_k),
    "Q4_K": Kind((0, "f16"), 2, _k_bound(15), _q4_k),
    "Q5_K": Kind((0, "f16"), 2, _k_bound(31), _q5_k),
    "Q6_K": Kind((208, "f16"), None, _q6_k_bound, _q6_k),
    "IQ4_NL": Kind((0, "f16"), None, _const(127), _iq4_nl),
    "IQ4_XS": Kind((0, "f16"), None, _const(32 * 127), _iq4_xs),
    "TQ2_0": Kind((64, "f16"), None, _const(2), _tq2_0),
    "MXFP4": Kind((0, "e8m0_half"), None, _const(12), _mxfp4),
    # d judged; generous upper bounds (sub-scale x grid value) only rule overflow out
    "IQ2_XXS": Kind((0, "f16"), None, _const(16 * 64), None, False),
    "IQ2_XS": Kind((0, "f16"), None, _const(16 * 64), None, False),
    "IQ2_S": Kind((0, "f16"), None, _const(16 * 64), None, False),
    "IQ3_XXS": Kind((0, "f16"), None, _const(32 * 64), None, False),
    "IQ3_S": Kind((0, "f16"), None, _const(32 * 64), None, False),
    "IQ1_S": Kind((0, "f16"), None, _const(16 * 2), None, False),
    "TQ1_0": Kind((52, "f16"), None, _const(2), None, False),
    "Q1_0": Kind((0, "f16"), None, _const(2), None, False),
}
NOT_CHECKED = {
    "IQ1_M": "its block scale is split across the sub-block scales, not an fp16 field",
    "NVFP4": "its scales are fp8 per 16 values (not read yet)",
    "Q8_1": "an intermediate type ggml does not store in files",
    "Q8_K": "an intermediate type ggml does not store in files",
}


@dataclass(frozen=True)
class GgufLayout:
    type: str
    block: int  # elements per block
    size: int  # bytes per block
    n_blocks: int
    shape: tuple[int, ...]  # index shape: rows in numpy order, then blocks per row


class Gguf:
    name = "gguf"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        if ctx.ck.format != "gguf":
            return []
        found = []
        for name in sorted(ctx.names):
            t = ggml_type(ctx.tag(name))
            if t is None or not ctx.free(name):
                continue
            tname, blck, size = t
            shape = ctx.shape(name)
            ctx.claim(name)
            if tname not in KINDS:
                ctx.skip(
                    name,
                    f"gguf:{tname}",
                    f"GGUF {tname} is not checked: {NOT_CHECKED.get(tname, 'unknown layout')}",
                )
                continue
            if not math.prod(shape):
                continue
            idx_shape = (*shape[:-1], shape[-1] // blck) if shape else (1,)
            lay = GgufLayout(tname, blck, size, math.prod(idx_shape), tuple(idx_shape))
            found.append(QuantizedWeight(name, f"gguf:{tname}", name, self, lay))
        return found

    def _fields(self, ck: Checkpoint, q: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every block's d (and dmin), read in bounded windows of whole blocks."""
        lay: GgufLayout = q.layout
        kind = KINDS[lay.type]
        d = np.zeros(lay.n_blocks, dtype=F32)  # holes of a sparse file stay zero bytes: d = 0
        m = np.zeros(lay.n_blocks, dtype=F32)
        bound = np.zeros(lay.n_blocks, dtype=F32)
        for first, piece in ck.byte_stripes(q.name, lay.size):
            if piece is None:
                continue
            b = piece.reshape(-1, lay.size)
            i0, i1 = first // lay.size, first // lay.size + b.shape[0]
            d[i0:i1] = _d(b, kind)
            if kind.m is not None:
                m[i0:i1] = _f16(b, kind.m)
            bound[i0:i1] = kind.bound(b, d[i0:i1], np.nan_to_num(m[i0:i1], nan=0.0, posinf=0.0, neginf=0.0))
            del piece, b
        return d, m, bound

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:

        lay: GgufLayout = q.layout
        kind = KINDS[lay.type]
        d, m, bound = self._fields(ck, q)
        bad_m = ~np.isfinite(m)
        extra: list[dict[str, Any]] = []
        for i in np.flatnonzero(bad_m)[:100].tolist():
            v = float(m[i])
            extra.append(
                {
                    "index": unravel(i, list(lay.shape)),
                    "scale": "nan" if v != v else "inf",
                    "problem": "nan" if v != v else "inf",
                    "field": "dmin",
                }
            )
        stripe_of = np.arange(lay.n_blocks, dtype=np.int64) // STRIPE_BLOCKS
        n_stripes = -(-lay.n_blocks // STRIPE_BLOCKS)
        return Blocks(
            d,
            list(lay.shape),
            bound,
            stripe_of,
            n_stripes,
            STRIPE_BLOCKS * lay.size * 8,
            negative_listed=False,
            extra_bad=extra,
            extra_faults=int(bad_m.sum()),
            bound_only=kind.dequant is None,
            absolute=True,
            exclude=bad_m,
            sizes=lay.block,
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        lay: GgufLayout = q.layout
        kind = KINDS[lay.type]
        for s in range(first, first + count):
            b0, b1 = s * STRIPE_BLOCKS, min(lay.n_blocks, (s + 1) * STRIPE_BLOCKS)
            b = ck.read_bytes(q.name, b0 * lay.size, (b1 - b0) * lay.size).reshape(b1 - b0, lay.size)
            d = _d(b, kind)
            m = _f16(b, kind.m) if kind.m is not None else np.zeros_like(d)
            idx = np.arange(b0, b1, dtype=np.int64)
            if kind.dequant is None:  # bound only: holds data when any byte besides d is set
                keep = np.ones(lay.size, dtype=bool)
                keep[kind.d[0] : kind.d[0] + 2] = False
                holds = (b[:, keep] != 0).any(axis=1)
                yield idx, kind.bound(b, d, m), holds
                continue
            w = kind.dequant(b, d, m)
            holds = np.ones(b.shape[0], dtype=bool)  # only a zero d's block needs the answer
            z = np.flatnonzero(d == 0)
            if z.size:  # its codes against the zero point: dequantized with d = 1 and no min
                bz = b[z]
                holds[z] = (
                    kind.dequant(bz, np.ones(z.size, dtype=F32), np.zeros(z.size, dtype=F32)) != 0
                ).any(axis=1)
            yield idx, np.nan_to_num(np.abs(w), nan=0.0).max(axis=1), holds


def _d(b: np.ndarray, kind: Kind) -> np.ndarray:
    off, how = kind.d
    if how == "e8m0_half":  # ggml's GGML_E8M0_TO_FP32_HALF: 2**(e - 128); 0xFF is NaN
        return e8m0_values(b[:, off], 128)
    return _f16(b, off)
