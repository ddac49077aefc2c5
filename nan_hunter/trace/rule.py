"""The one rule two recordings of the same entry are compared by.

``nanhunter diff`` (two traces), ``--repeat`` (a run against its own re-runs: ``spread``),
``scan --compile`` (eager against compiled) and a watch's ``reproducible`` (a fault against its
re-run) all ask it, so the same pair of statistics gets the same answer whoever asks.

- Non-finite values are compared by class: the same classes (NaN, +inf, −inf present or not)
  on both sides agree; any other pair is a divergence (``rel_err`` inf).
- ``rel_err`` = max over the statistics absmax, mean and l2 of |a − b| / max(|a|, |b|): symmetric
  (A against B is B against A), and at most 2 for finite values. The mean is measured on the
  scale of the values: its denominator is the larger absmax (a LayerNorm output's mean is ~0, and
  rounding noise divided by ~0 would look infinite); |Δmean| ≤ max|Δ|, so outputs that agree
  element by element agree on their mean. A statistic present on one side only (no finite value
  on the other) is a divergence.
- An absolute floor: a difference below the smallest normal number of the entry's dtype agrees
  (a subnormal against the zero a flush-to-zero run made of it is not a 1e18 relative error).
- tolerance = max(rtol, 4 × spread), where rtol is ``--rtol`` or, by default, 1e-3 for fp32/fp64
  and 1e-2 for bf16/fp16/fp8, the loosest among the dtypes given (``diff`` gives those of the
  entry's output and inputs on both sides: the precision each side computed in), and spread the
  larger of the two entries' run-to-run spreads (``--repeat``; 0 without): a non-deterministic
  op is never a divergence by itself.
"""

from __future__ import annotations

import math
from typing import Any

#: ``--rtol`` defaults: 1e-3 for 32- and 64-bit floats, 1e-2 for the narrow ones
WIDE_RTOL = 1e-3
NARROW_RTOL = 1e-2
NARROW = frozenset(("bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "fp8-e4m3fnuz", "fp8-e5m2fnuz", "fp8-e8m0"))
SPREAD_FACTOR = 4.0
#: a spread where a re-run changed the non-finite classes: nothing about that entry can be told
MAX_SPREAD = 1e300
_TINY = {
    "fp64": 2.2250738585072014e-308,
    "fp32": 1.1754943508222875e-38,
    "bf16": 1.1754943508222875e-38,
    "fp16": 6.103515625e-05,
    "fp8-e4m3": 0.015625,
    "fp8-e5m2": 6.103515625e-05,
}


def classes(s: Any) -> tuple[bool, bool, bool]:
    return bool(s.nan), bool(s.posinf), bool(s.neginf)


def smallest_normal(dtype: str | None) -> float:
    """The smallest normal number of ``dtype`` (fp32's for an unknown or missing dtype)."""
    return _TINY.get(dtype or "", _TINY["fp32"])


def _part(a: float | None, b: float | None, scale: float, floor: float) -> float:
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    diff = abs(a - b)
    if diff < floor:  # below the dtype's smallest normal: subnormal against zero agrees
        return 0.0
    return diff / scale if scale > 0 else math.inf


def rel_err(a: Any, b: Any, dtype: str | None = None) -> float:
    """How far ``a``'s statistics are from ``b``'s, by the rule above (symmetric). ``a`` and ``b``
    have ``nan``, ``posinf``, ``neginf``, ``absmax``, ``mean`` and ``l2``; ``dtype`` sets the
    floor (the narrower of the two sides' dtypes is the caller's choice)."""
    if classes(a) != classes(b):
        return math.inf
    floor = smallest_normal(dtype)
    scale = max(abs(a.absmax or 0.0), abs(b.absmax or 0.0))
    errs = (
        _part(a.absmax, b.absmax, scale, floor),
        _part(a.l2, b.l2, max(abs(a.l2 or 0.0), abs(b.l2 or 0.0)), floor),
        _part(a.mean, b.mean, max(abs(a.mean or 0.0), abs(b.mean or 0.0), scale), floor),
    )
    return max(errs)


def default_rtol(*dtypes: str | None) -> float:
    """1e-2 when any of ``dtypes`` is a narrow float, else 1e-3."""
    return NARROW_RTOL if any(d in NARROW for d in dtypes) else WIDE_RTOL


def tolerance(rtol: float | None, dtypes: tuple[str | None, ...], spreads: tuple[float | None, ...]) -> float:
    base = rtol if rtol is not None else default_rtol(*dtypes)
    return max(base, SPREAD_FACTOR * max((s or 0.0) for s in spreads) if spreads else 0.0)


def spread_of(run: Any, first: Any, dtype: str | None) -> float:
    """The run-to-run spread of one re-run against the first run (``MAX_SPREAD`` when the
    non-finite classes changed)."""
    e = rel_err(run, first, dtype)
    return MAX_SPREAD if math.isinf(e) else e
