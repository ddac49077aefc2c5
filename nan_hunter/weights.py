"""Static weights scan: non-finite values and dtype headroom, tensor by tensor.

Fast path per tensor: one ``torch.aminmax`` pass (NaN propagates, memory speed) gives
finite-or-not and absmax, hence overflow headroom for every target dtype exactly. Full counts
and the first bad index are computed only for non-finite tensors. Underflow (how much of the
tensor flushes to zero or goes subnormal in fp16) needs a pass of its own; by default it is
estimated on a fixed strided sample (``SAMPLE`` elements, marked ``sampled``), and
``stats="full"`` computes it exactly (3-7x slower, measured in BENCHMARKS.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .dtypes import HEADROOM_DTYPES, limits
from .load import Checkpoint

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
    """(fraction of non-zero values flushed to 0 in fp16, fraction that become subnormal, min |x|>0, sampled)."""
    import torch

    flat = x.reshape(-1)
    sampled = False
    if not exact and flat.numel() > SAMPLE:
        step = flat.numel() // SAMPLE
        flat = flat[:: step][:SAMPLE]
        sampled = True
    a = flat.float().abs()
    a = a[torch.isfinite(a)]
    n = a.numel()
    if n == 0:
        return 0.0, 0.0, None, sampled
    fp16 = limits("fp16")
    nz = a[a > 0]
    # fp16 rounds to nearest: below half the smallest subnormal a value becomes 0.
    flush = int(torch.count_nonzero(nz < fp16.smallest_subnormal / 2))
    sub = int(torch.count_nonzero((nz >= fp16.smallest_subnormal / 2) & (nz < fp16.smallest_normal)))
    mn = float(nz.min()) if nz.numel() else None
    return flush / n, sub / n, mn, sampled


def scan_tensor(name: str, t, exact: bool = False) -> TensorScan:
    import torch

    from .dtypes import name_of
    from .kernels.reference import full_row, quick_row
    from .stats import TensorStats

    dt = name_of(t.dtype)
    ts = TensorScan(name, str(t.dtype).removeprefix("torch."), list(t.shape), t.numel())
    if dt is None or not t.is_floating_point():
        ts.skipped = "not floating point"
        return ts
    if t.numel() == 0:
        ts.skipped = "empty"
        return ts
    quick = quick_row(t)
    if quick is None:
        ints, floats = full_row(t)
        st = TensorStats.from_row(ints.tolist(), floats.tolist())
        ts.nan, ts.posinf, ts.neginf = st.nan, st.posinf, st.neginf
        ts.first_index = _unravel(st.first_nonfinite, list(t.shape)) if st.first_nonfinite is not None else None
        ts.absmax = st.absmax
    else:
        ts.absmax = quick[1][0]
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
        if progress is not None:
            progress(name, t.numel() * t.element_size())
        del t
    return WeightsScan(out, len(out), skipped, ck.nbytes)
