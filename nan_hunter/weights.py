"""Static weights scan: non-finite values and dtype headroom, tensor by tensor.

Fast path per tensor: one ``torch.aminmax`` pass (NaN propagates, memory speed) gives
finite-or-not and absmax, hence overflow headroom for every target dtype exactly. Full counts
and the first bad index are computed only for non-finite tensors. Underflow (how much of the
tensor flushes to zero or goes subnormal in fp16) needs a pass of its own; by default it is
estimated on a fixed strided sample (``SAMPLE`` elements, marked ``sampled``), and
``stats="full"`` computes it exactly (15-20x slower than the fast path on CPU, measured in
BENCHMARKS.md).

Memory stays bounded by the largest tensor: the slow paths (a tensor holding NaN/Inf, the exact
underflow pass, 1-byte dtypes widened to fp32) work on ``CHUNK``-element slices, and
``scan_weights`` closes a shard's memory map after each tensor (it is re-mapped lazily for the
next one), so pages already scanned do not accumulate in the process's resident set.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .dtypes import HEADROOM_DTYPES, limits
from .load import Checkpoint

SAMPLE = 65536
CHUNK = 1 << 18  # elements per slice on the slow paths: temporaries of ~1 MB, cache-resident
SERIAL = 32768  # slice of the underflow sample: at torch's parallel grain size, so its small ops run
# inline instead of waking OpenMP workers (measured 26-120 ms -> ~1 ms per tensor on a busy 2-core box)


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
    fp16_zero_frac: float | None = None       # non-zero values that become 0 in fp16
    fp16_subnormal_frac: float | None = None  # values that become fp16 subnormals
    sampled: bool = False
    skipped: str | None = None

    @property
    def finite(self) -> bool:
        return not (self.nan or self.posinf or self.neginf)

    def nonfinite_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape, "nan": self.nan,
                "posinf": self.posinf, "neginf": self.neginf, "first_index": self.first_index}

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        return d


@dataclass
class WeightsScan:
    tensors: list[TensorScan]
    n_tensors: int
    n_skipped: int
    bytes: int

    @property
    def nonfinite(self) -> list[TensorScan]:
        return [t for t in self.tensors if not t.finite]

    def near_overflow(self, dtype: str, factor: float) -> list[TensorScan]:
        """Finite tensors whose absmax is within ``factor`` of ``dtype``'s max (or over it)."""
        return [t for t in self.tensors if t.finite and t.headroom.get(dtype) is not None
                and t.headroom[dtype] < factor]


def _unravel(flat: int, shape: list[int]) -> list[int]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat //= s if s else 1
    return list(reversed(out))


def _underflow(x, exact: bool) -> tuple[float, float, float | None, bool]:
    """(fraction of non-zero values flushed to 0 in fp16, fraction that become subnormal, min |x|>0, sampled).

    Fractions are over the finite values; computed ``CHUNK`` elements at a time with counts
    (no boolean-index copies), so the temporaries stay small whatever the tensor's size.
    """
    import torch

    flat = x.reshape(-1)
    sampled = False
    if not exact and flat.numel() > SAMPLE:
        step = flat.numel() // SAMPLE
        flat = flat[:: step][:SAMPLE]
        sampled = True
    fp16 = limits("fp16")
    # fp16 rounds to nearest: below half the smallest subnormal a value becomes 0.
    half_sub, normal = fp16.smallest_subnormal / 2, fp16.smallest_normal
    n = flush = sub = 0
    mn = math.inf
    chunk = SERIAL if sampled else CHUNK
    for s in range(0, flat.numel(), chunk):
        a = flat[s: s + chunk].float().abs()
        # comparisons are False for NaN and +inf is above every bound, so finite values are the
        # a < inf ones, and the bands below count finite values only (cheaper than isfinite).
        n += int(torch.count_nonzero(a < math.inf))
        gt0 = a > 0
        below_half = a < half_sub
        n_below_half = int(torch.count_nonzero(below_half))
        flush += int(torch.count_nonzero(gt0 & below_half))
        sub += int(torch.count_nonzero(a < normal)) - n_below_half  # half_sub <= a < normal
        mn = min(mn, float(torch.where(gt0, a, math.inf).min()))  # +inf never wins, NaN is masked
    if n == 0:
        return 0.0, 0.0, None, sampled
    return flush / n, sub / n, (mn if mn < math.inf else None), sampled


def _value_stats(t) -> tuple[int, int, int, int | None, float | None]:
    """(nan, posinf, neginf, flat index of the first non-finite value, absmax over finite values).

    One ``aminmax`` pass when ``t`` is all-finite. Otherwise (and for 1-byte dtypes, which
    ``quick_row`` widens to fp32) ``t`` is walked ``CHUNK`` elements at a time: a finite chunk
    costs one ``aminmax``, only chunks holding NaN/Inf go through ``full_row``; counts add up,
    the first index is the first bad chunk's, absmax is the max over chunks.
    """
    from .kernels.reference import full_row, quick_row
    from .stats import TensorStats

    n = t.numel()
    if t.element_size() > 1 or n <= CHUNK:
        quick = quick_row(t)
        if quick is not None:
            return 0, 0, 0, None, quick[1][0]
        if n <= CHUNK:
            ints, floats = full_row(t)
            st = TensorStats.from_row(ints.tolist(), floats.tolist())
            return st.nan, st.posinf, st.neginf, st.first_nonfinite, st.absmax
    flat = t.reshape(-1)
    nan = posinf = neginf = 0
    first: int | None = None
    absmax: float | None = None
    for s in range(0, n, CHUNK):
        c = flat[s: s + CHUNK]
        quick = quick_row(c)
        if quick is not None:
            a = quick[1][0]
        else:
            ints, floats = full_row(c)
            st = TensorStats.from_row(ints.tolist(), floats.tolist())
            nan, posinf, neginf = nan + st.nan, posinf + st.posinf, neginf + st.neginf
            if first is None and st.first_nonfinite is not None:
                first = s + st.first_nonfinite
            a = st.absmax
        if a is not None:
            absmax = a if absmax is None else max(absmax, a)
    return nan, posinf, neginf, first, absmax


def scan_tensor(name: str, t, exact: bool = False) -> TensorScan:
    import torch

    from .dtypes import name_of

    dt = name_of(t.dtype)
    ts = TensorScan(name, str(t.dtype).removeprefix("torch."), list(t.shape), t.numel())
    if dt is None or not t.is_floating_point():
        ts.skipped = "not floating point"
        return ts
    if t.numel() == 0:
        ts.skipped = "empty"
        return ts
    ts.nan, ts.posinf, ts.neginf, first, ts.absmax = _value_stats(t)
    if not ts.finite:
        ts.first_index = _unravel(first, list(t.shape)) if first is not None else None
    for target in HEADROOM_DTYPES:
        mx = limits(target).max
        ts.overflows[target] = bool(ts.absmax is not None and ts.absmax > mx)
        ts.headroom[target] = (mx / ts.absmax) if ts.absmax else math.inf
    if t.dtype != torch.float16 or exact:
        zf, sf, mn, sampled = _underflow(t, exact)
        ts.fp16_zero_frac, ts.fp16_subnormal_frac, ts.min_nonzero, ts.sampled = zf, sf, mn, sampled
    else:  # already fp16: nothing changes when cast
        ts.fp16_zero_frac, ts.fp16_subnormal_frac = 0.0, None
    return ts


def _unmap(ck: Checkpoint, name: str) -> None:
    """Close the memory map of the shard holding ``name`` (``SafetensorsFile.close``): once the
    scanned tensor's views are gone the GC unmaps it, so its pages leave this process's RSS
    (they stay in the page cache); the next tensor re-maps the file lazily. Nothing is discarded:
    a view still held elsewhere keeps its own map alive."""
    e = ck.entries.get(name) if ck._torch_sd is None else None
    f = ck._files.get(e.file) if e is not None else None
    if f is not None:
        f.close()


def scan_weights(ck: Checkpoint, exact: bool = False,
                 progress: Callable[[str, int], None] | None = None) -> WeightsScan:
    """Scan every tensor of ``ck``; ``progress(name, nbytes)`` is called after each one."""
    out: list[TensorScan] = []
    skipped = 0
    for name, t in ck.tensors():
        ts = scan_tensor(name, t, exact)
        if ts.skipped:
            skipped += 1
        out.append(ts)
        nbytes = t.numel() * t.element_size()
        del t
        _unmap(ck, name)
        if progress is not None:
            progress(name, nbytes)
    return WeightsScan(out, len(out), skipped, ck.nbytes)
