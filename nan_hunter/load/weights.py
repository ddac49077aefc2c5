"""Static weights scan: non-finite values and dtype headroom, tensor by tensor, with numpy only.

The scan reads the checkpoint's read-only memory map with numpy and never imports torch (a
weights-only ``scan`` or ``check`` starts in the time numpy takes to import). Floats are read from
their bits (``float_bits``: F64, F32, F16 and BF16 by one rule), the 1-byte and sub-byte floats from
their codes (``bit_dtypes``).

Fast path per piece: two integer reductions over the bits (``float_bits.top_magnitude``, memory
speed) give finite-or-not and the absmax, hence overflow headroom for every target dtype exactly.
Full counts and the first bad index are computed only for pieces holding NaN/Inf. Underflow (how
much of the tensor flushes to zero or goes subnormal in fp16) needs a pass of its own, on the
values as float32; by default it is estimated on a fixed strided sample (``SAMPLE`` elements,
marked ``sampled``), and ``stats="full"`` computes it exactly (measured in BENCHMARKS.md).

Memory stays flat whatever the checkpoint's size: tensors arrive from the loader in bounded
read-only pieces (``Checkpoint.scan_items``: one memory-map window at a time, holes of sparse
files as runs of zeros) and are accumulated piece by piece (``TensorStatsAccumulator``); the slow
paths (a piece holding NaN/Inf, the underflow pass) work on ``CHUNK``-element slices. Nothing here
writes to an array it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import HEADROOM_DTYPES, limits
from .bit_dtypes import BIT_TAGS, CodeHistogram, code_values
from .checkpoint import Checkpoint, ScanItem, _torch_items
from .float_bits import CACHE_BYTES, CHUNK, FLOATS, FloatBits, exact_counts
from .quant.registry import scan_quantized_claims

if TYPE_CHECKING:  # pragma: no cover
    import torch

SAMPLE = 65536


@dataclass
class TensorScan:
    name: str
    dtype: str
    shape: list[int]
    numel: int
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    first_index: list[int] | None = None
    absmax: float | None = None
    min_nonzero: float | None = None
    overflows: dict[str, bool] = field(default_factory=dict)
    headroom: dict[str, float] = field(default_factory=dict)  # dtype max / absmax
    fp16_zero_frac: float | None = None  # non-zero values that become 0 in fp16
    fp16_subnormal_frac: float | None = None  # values that become fp16 subnormals
    sampled: bool = False
    skipped: str | None = None
    unchecked: bool = False  # skipped although it could hold NaN/Inf (listed in weights.unchecked)
    file: str | None = None  # the shard holding it, in a sharded checkpoint (else None, and not written)

    @property
    def finite(self) -> bool:
        return not (self.nan or self.posinf or self.neginf)

    def nonfinite_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": self.shape,
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "first_index": self.first_index,
        }
        if self.file is not None:
            d["file"] = self.file
        return d

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if d["file"] is None:
            del d["file"]
        return d


@dataclass
class WeightsScan:
    tensors: list[TensorScan]
    n_tensors: int
    n_skipped: int
    bytes: int
    quantized: list[Any] = field(default_factory=list)  # quant.base.QuantizedScan, one per quantized weight
    quantized_unchecked: list[dict[str, str]] = field(
        default_factory=list
    )  # found but not checkable: {name, dtype, reason}
    claimed: set[str] = field(
        default_factory=set
    )  # tensors a quantized format read (data, scales, zeros, states)

    @property
    def nonfinite(self) -> list[TensorScan]:
        return [t for t in self.tensors if not t.finite]

    @property
    def unchecked(self) -> list[dict[str, Any]]:
        """``weights.unchecked``: tensors that could hold NaN/Inf but were not checked."""
        return [
            {"name": t.name, "dtype": t.dtype, "reason": t.skipped}
            for t in self.tensors
            if t.unchecked and t.name not in self.claimed
        ] + self.quantized_unchecked

    def near_overflow(self, dtype: str, factor: float) -> list[TensorScan]:
        """Finite tensors whose absmax is within ``factor`` of ``dtype``'s max (or over it)."""
        return [
            t
            for t in self.tensors
            if t.finite and t.headroom.get(dtype) is not None and t.headroom[dtype] < factor
        ]


def _unravel(flat: int, shape: list[int]) -> list[int]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat //= s if s else 1
    return list(reversed(out))


def _count_underflow(fb: FloatBits, bits: np.ndarray, chunk: int, c: list[float]) -> None:
    """Add to ``c`` = [finite, flushed to 0 in fp16, fp16 subnormal, min |x| > 0] the values of 1-D
    unsigned ``bits``.

    ``chunk`` elements at a time, on the values as float32 (F64 rounded as a cast rounds it), with
    counts (no boolean-index copies), so temporaries stay small whatever the size; ``bits`` is only
    read.
    """
    fp16 = limits("fp16")
    # fp16 rounds to nearest: below half the smallest subnormal a value becomes 0.
    half_sub, normal = fp16.smallest_subnormal / 2, fp16.smallest_normal
    for s in range(0, bits.size, chunk):
        with np.errstate(over="ignore"):  # an F64 value beyond float32's range is inf, as a cast makes it
            a = np.abs(fb.float32(bits[s : s + chunk]))
        # comparisons are False for NaN and +inf is above every bound, so finite values are the
        # a < inf ones, and the bands below count finite values only (cheaper than isfinite).
        c[0] += int(np.count_nonzero(a < math.inf))
        gt0 = a > 0
        below_half = a < half_sub
        n_below_half = int(np.count_nonzero(below_half))
        c[1] += int(np.count_nonzero(gt0 & below_half))
        c[2] += int(np.count_nonzero(a < normal)) - n_below_half  # half_sub <= a < normal
        if a.size:
            c[3] = min(c[3], float(np.where(gt0, a, math.inf).min()))  # +inf never wins, NaN is masked


def _value_stats(fb: FloatBits, bits: np.ndarray) -> tuple[int, int, int, int | None, float | None]:
    """(nan, posinf, neginf, flat index of the first non-finite value, absmax over finite values) of
    1-D unsigned ``bits``, in one pass (``exact_counts``): two integer reductions per ``CHUNK``-element
    slice, and only slices holding NaN/Inf counted exactly.
    """
    if not bits.size:
        return 0, 0, 0, None, None
    nan, posinf, neginf, first, best = exact_counts(fb, bits)
    return nan, posinf, neginf, first, fb.value(best)


class TensorStatsAccumulator:
    """Statistics of one float tensor (tag F64, F32, F16 or BF16) fed piece by piece: consecutive runs
    of its flat elements, as numpy arrays of the tag's dtype or of its unsigned bits.

    Counts add up, the first non-finite index is the first piece's that has one, absmax is the
    max over pieces. The fp16 underflow pass is exact over every piece with ``exact``, else it
    runs on the same fixed strided sample as a whole-tensor scan would take (``SAMPLE``
    elements, every ``numel // SAMPLE``-th), counted piece by piece as the pieces pass.
    """

    def __init__(self, numel: int, tag: str, exact: bool):
        self.fb = FLOATS[tag]
        self.nan = self.posinf = self.neginf = 0
        self.first: int | None = None
        self.absmax: float | None = None
        self.underflow = tag != "F16" or exact  # already fp16: nothing changes when cast
        self.step = numel // SAMPLE if not exact and numel > SAMPLE else 0
        self.counts: list[float] = [0, 0, 0, math.inf]

    def _absmax(self, a: float | None) -> None:
        if a is not None:
            self.absmax = a if self.absmax is None else max(self.absmax, a)

    def _sample_range(self, first: int, count: int) -> tuple[int, int]:
        """(offset within the piece of its first sampled element, how many sampled elements)."""
        k_lo = -(-first // self.step)
        k_hi = min(SAMPLE, -(-(first + count) // self.step))
        return k_lo * self.step - first, max(0, k_hi - k_lo)

    def add(self, first: int, piece: np.ndarray) -> None:
        """Elements ``first .. first + piece.size`` of the flattened tensor (``piece`` is 1-D, only read)."""
        bits = self.fb.bits(piece)
        nan, posinf, neginf, bad, a = _value_stats(self.fb, bits)
        self.nan, self.posinf, self.neginf = self.nan + nan, self.posinf + posinf, self.neginf + neginf
        if self.first is None and bad is not None:
            self.first = first + bad
        self._absmax(a)
        if not self.underflow:
            return
        if self.step:  # counts add up: the sample is counted piece by piece, nothing is kept
            off, k = self._sample_range(first, bits.size)
            if k:
                _count_underflow(self.fb, bits[off :: self.step][:k], CHUNK, self.counts)
        else:
            _count_underflow(self.fb, bits, CHUNK, self.counts)

    def add_zeros(self, first: int, count: int) -> None:
        """Elements ``first .. first + count`` are all zero (a hole of a sparse file)."""

        self._absmax(0.0)
        if self.underflow:  # zeros are finite, neither flushed to zero nor subnormal
            self.counts[0] += self._sample_range(first, count)[1] if self.step else count

    def finish(self, ts: TensorScan, shape: list[int]) -> TensorScan:

        ts.nan, ts.posinf, ts.neginf, ts.absmax = self.nan, self.posinf, self.neginf, self.absmax
        if not ts.finite:
            ts.first_index = _unravel(self.first, shape) if self.first is not None else None
        _finish_limits(ts)
        if not self.underflow:
            ts.fp16_zero_frac, ts.fp16_subnormal_frac = 0.0, None
            return ts
        ts.sampled = bool(self.step)
        n, flush, sub, mn = self.counts
        if n:
            ts.fp16_zero_frac, ts.fp16_subnormal_frac = flush / n, sub / n
            ts.min_nonzero = mn if mn < math.inf else None
        else:
            ts.fp16_zero_frac, ts.fp16_subnormal_frac = 0.0, 0.0
        return ts


#: skip reasons of tensors that cannot hold NaN/Inf (every other skip is listed as unchecked)
NOTHING_TO_CHECK = ("not floating point", "empty")


def _mark(ts: TensorScan, reason: str | None) -> None:
    ts.skipped = reason
    ts.unchecked = reason is not None and reason not in NOTHING_TO_CHECK


def _finish_limits(ts: TensorScan) -> None:
    for target in HEADROOM_DTYPES:
        mx = limits(target).max
        ts.overflows[target] = bool(ts.absmax is not None and ts.absmax > mx)
        ts.headroom[target] = (mx / ts.absmax) if ts.absmax else math.inf


#: 1-byte float tags scanned by two read-only reductions per piece (``_fp8_fast``)
FAST_FP8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")


def _fp8_fast(item: ScanItem, pieces: Iterator[tuple[int, int, Any]], ts: TensorScan) -> TensorScan:
    """fp8 from its bits at memory speed: sign-magnitude codes order like their magnitudes, so the
    largest positive magnitude is the int8 max of the bytes and the largest negative one the uint8 max
    minus 0x80 (two read-only reductions, no temporary). NaN/Inf codes are the largest magnitudes
    (e4m3fn: 0x7F; e5m2: 0x7C and up; E8M0: 0xFF) or int8's minimum (FNUZ: 0x80), so a piece whose
    maxima stay below them holds none. A piece that holds one is counted exactly with the code
    histogram; fp16 underflow comes from a fixed strided sample (``SAMPLE`` bytes, marked sampled), as
    for float tensors."""

    tag = item.bits or ""
    vals = code_values(tag)
    bad_mag = {"F8_E4M3": 0x7F, "F8_E5M2": 0x7C}.get(tag)
    hist = CodeHistogram(tag)  # pieces holding NaN/Inf
    sample = CodeHistogram(tag)
    step = max(1, item.numel // SAMPLE)
    best = -1  # largest finite magnitude code (E8M0: largest code)
    for first, count, piece in pieces:
        if piece is None:
            sample.add_zeros(len(range(-first % step, count, step)))
            best = max(best, 0)
            continue
        if tag == "F8_E8M0":
            hi = _byte_extremes(piece, signed=False)[1]
            bad, top = hi == 0xFF, hi
        else:
            lo, hi, neg = _byte_extremes(piece, signed=True, low=tag.endswith("FNUZ"))
            top = max(hi if hi >= 0 else 0, neg - 0x80 if neg >= 0x80 else 0)
            bad = (lo == -128) if tag.endswith("FNUZ") else (bad_mag is not None and top >= bad_mag)
        if bad:
            hist.add(first, piece)
        else:
            best = max(best, top)
        sample.add(first, piece[-first % step :: step][:SAMPLE])
        del piece
    nan, absmax, _, _, _, _ = hist.stats()
    ts.nan = nan
    ts.posinf, ts.neginf = hist.infs()
    if best >= 0:
        a = abs(vals[best])
        absmax = a if absmax is None else max(absmax, a)
    ts.absmax = absmax
    if not ts.finite and hist.first_nan is not None:
        ts.first_index = _unravel(hist.first_nan, item.shape)
    _finish_limits(ts)
    _, _, finite, flush, sub, mn = sample.stats()
    n = max(1, finite)
    ts.fp16_zero_frac, ts.fp16_subnormal_frac, ts.min_nonzero = flush / n, sub / n, mn
    ts.sampled = True
    return ts


def scan_bits(item: ScanItem, exact: bool = False) -> TensorScan:
    """A tensor of a dtype checked from its bits (``bit_dtypes``): counts from a code histogram (or, for
    1-byte floats when not ``exact``, two reductions per piece: ``_fp8_fast``)."""

    ts = TensorScan(item.name, item.dtype, item.shape, item.numel)
    if item.numel == 0 or item.pieces is None:
        _mark(ts, "empty" if item.numel == 0 else f"dtype {item.dtype} is not scanned")
        return ts
    if not exact and item.bits in FAST_FP8:
        return _fp8_fast(item, item.pieces, ts)
    hist = CodeHistogram(item.bits or "")
    for first, count, piece in item.pieces:
        if piece is None:
            hist.add_zeros(count)
        else:
            hist.add(first, piece)
        del piece
    per_byte = BIT_TAGS[hist.tag][2] / BIT_TAGS[hist.tag][1]
    nan, ts.absmax, finite, flush, sub, ts.min_nonzero = hist.stats()
    extra = int(sum(hist.counts) - item.numel)  # padding codes of a last partial group: counted as data
    ts.nan = nan
    ts.posinf, ts.neginf = hist.infs()
    if not ts.finite and hist.first_nan is not None:
        ts.first_index = _unravel(int(hist.first_nan * per_byte), item.shape)
    _finish_limits(ts)
    n = max(1, finite - max(0, extra))
    ts.fp16_zero_frac, ts.fp16_subnormal_frac = flush / n, sub / n
    return ts


def _byte_extremes(piece: np.ndarray, signed: bool, low: bool = False) -> tuple[int, int, int]:
    """(int8 min (only with ``low``, else 0), int8 max (uint8 max unless ``signed``), uint8 max) of 1-D
    uint8 ``piece``, a cache-sized slice at a time so each slice is read from memory once."""
    s8 = piece.view(np.int8)
    lo, hi, neg = 0, -129 if signed else -1, -1
    step = CACHE_BYTES
    for s in range(0, piece.size, step):
        if signed:
            hi = max(hi, int(s8[s : s + step].max()))
            if low:
                lo = min(lo, int(s8[s : s + step].min()))
        neg = max(neg, int(piece[s : s + step].max()))
    return lo, (hi if signed else neg), neg


def scan_tensor(name: str, t: torch.Tensor, exact: bool = False) -> TensorScan:
    """Scan one in-memory torch tensor (read only), as a torch checkpoint's tensor is scanned."""

    return scan_item(next(_torch_items({name: t})), exact)


def scan_item(item: ScanItem, exact: bool = False) -> TensorScan:
    """Scan one streamed tensor of a checkpoint, piece by piece (flat memory whatever its size)."""
    if item.bits is not None:
        return scan_bits(item, exact)
    ts = TensorScan(item.name, item.dtype, item.shape, item.numel)
    _mark(ts, item.skip or ("empty" if item.numel == 0 else None))
    if ts.skipped or item.pieces is None or item.tag is None:
        return ts
    acc = TensorStatsAccumulator(item.numel, item.tag, exact)
    for first, count, piece in item.pieces:
        if piece is None:
            acc.add_zeros(first, count)
        else:
            acc.add(first, piece)
        del piece  # drop the view so its window can be unmapped
    return acc.finish(ts, item.shape)


def scan_weights(
    ck: Checkpoint, exact: bool = False, progress: Callable[[str, int], None] | None = None
) -> WeightsScan:
    """Scan every tensor of ``ck``; ``progress(name, nbytes)`` is called after each one."""

    out: list[TensorScan] = []
    skipped = 0
    with np.errstate(
        all="ignore"
    ):  # IEEE results (an F64 value past float32's range is inf) are what is measured
        sharded = len(ck.files) > 1
        for item in ck.scan_items():
            ts = scan_item(item, exact)
            e = ck.entry(item.name) if sharded else None
            ts.file = e.file.name if e is not None else None
            if ts.skipped:
                skipped += 1
            out.append(ts)
            if progress is not None:
                progress(item.name, item.nbytes)
        quantized, q_unchecked, claimed = scan_quantized_claims(ck)
    _add_code_faults(quantized, out)
    return WeightsScan(out, len(out), skipped, ck.nbytes, quantized, q_unchecked, claimed)


def _add_code_faults(quantized: list[Any], tensors: list[TensorScan]) -> None:
    """NaN/Inf codes of a quantized weight's data (fp8 data holding 0x7F) dequantize to NaN/Inf whatever
    their scale: counted in its ``dequant_nonfinite`` and ``overflows``. Where a NaN/Inf scale also makes
    whole blocks non-finite, a code may sit inside one: the count is then not known (None)."""
    by_name = {t.name: t for t in tensors}
    for q in quantized:
        t = by_name.get(q.name)
        if t is None or t.finite:
            continue
        codes = t.nan + t.posinf + t.neginf
        if q.dequant_nonfinite is not None:
            q.dequant_nonfinite = q.dequant_nonfinite + codes if q.nonfinite_blocks == 0 else None
        q.overflows = {d: True for d in q.overflows}
