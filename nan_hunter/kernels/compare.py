"""The one comparison of two runs' outputs: a candidate against a reference.

Replay (a dtype against float64), ``scan --compile`` (compiled against eager), op location (an
absorbed intermediate's module output against float64) and bisect (a mixed-precision run against
the all-high-precision one) all ask it, so the same pair of tensors gets the same answer
whoever asks.

Policy (stated once, tested in tests/unit/kernels/test_compare.py):

- Both sides are flattened to their floating tensors in a fixed order (``tree.float_tensors``)
  and compared in float64, so the comparison adds no rounding of its own.
- A different structure (a different number of tensors, or a shape that differs) is as far
  apart as it gets: ``error`` is inf.
- ``rel_err`` = max |candidate − reference| / max |reference| over the elements finite on both
  sides (0/0 is 0; x/0 is inf); None when no element is finite on both sides.
- Non-finite elements are compared by class (NaN, +inf, −inf): the same class on both sides is
  a match (as Polygraphy's ``infinities_compare_equal``: matching ±inf have an absdiff of 0,
  and so do two NaNs); any other pair — a NaN or ±inf against a finite value, or against
  another class — is a *mismatch* and makes ``error`` inf.
- ``error`` = inf on a structure difference or a mismatch, else ``rel_err`` (0 when None).
  ``parts(rtol)`` is ``error > rtol``, or one side finite and not the other.
- ``finite_rel_err`` is the relative error only where it means something: both sides finite
  everywhere (replay columns, the fix check's distance, an absorbed value's module output);
  callers read it instead of checking finiteness themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparison:
    """A candidate's outputs against a reference's (policy: module docstring)."""

    finite: bool  # the candidate holds no NaN/±inf
    ref_finite: bool  # the reference holds no NaN/±inf
    rel_err: float | None  # over the elements finite on both sides; None when there are none
    mismatched: int  # elements whose class differs (finite / NaN / +inf / −inf)
    same_structure: bool = True
    kind: str | None = None  # what the candidate holds: nan, else posinf, else neginf, else None
    ref_kind: str | None = None

    @property
    def error(self) -> float:
        """The one number for "how far apart": inf on a structure difference or a class mismatch."""
        if not self.same_structure or self.mismatched:
            return math.inf
        return self.rel_err if self.rel_err is not None else 0.0

    @property
    def finite_rel_err(self) -> float | None:
        """The relative error of two runs that are both finite everywhere and alike in structure;
        None otherwise (a non-finite run is described by its class, not by a relative error), and
        None when the reference is all zeros while the candidate is not (no relative error exists)."""
        if not (self.same_structure and self.finite and self.ref_finite):
            return None
        err = self.rel_err if self.rel_err is not None else 0.0
        return err if math.isfinite(err) else None

    def parts(self, rtol: float) -> bool:
        """Whether the two differ beyond ``rtol`` (or in finiteness)."""
        return self.finite != self.ref_finite or self.error > rtol


def _kind(nan: bool, pos: bool, neg: bool) -> str | None:
    return "nan" if nan else "posinf" if pos else "neginf" if neg else None


def flat(obj: Any) -> list[Any]:
    """The floating tensors of ``obj`` (a tensor, a tuple, a ModelOutput...), detached, in a fixed order."""
    from ..tree import float_tensors  # lazy: torch

    return [t.detach() for _, t in float_tensors(obj)]


def compare(candidate: Any, reference: Any) -> Comparison:
    """``candidate`` against ``reference``: tensors, lists of tensors or any nested output."""
    import torch

    cs = [t.double() for t in flat(candidate)]
    rs = [t.double() for t in flat(reference)]
    c_nan = any(bool(torch.isnan(t).any()) for t in cs)
    c_pos = any(bool((t == math.inf).any()) for t in cs)
    c_neg = any(bool((t == -math.inf).any()) for t in cs)
    r_nan = any(bool(torch.isnan(t).any()) for t in rs)
    r_pos = any(bool((t == math.inf).any()) for t in rs)
    r_neg = any(bool((t == -math.inf).any()) for t in rs)
    kind, ref_kind = _kind(c_nan, c_pos, c_neg), _kind(r_nan, r_pos, r_neg)
    if len(cs) != len(rs) or any(a.shape != b.shape for a, b in zip(cs, rs)):
        return Comparison(kind is None, ref_kind is None, math.inf, 0, False, kind, ref_kind)
    num = den = 0.0
    seen = False
    mismatched = 0
    for c, r in zip(cs, rs):
        cf, rf = torch.isfinite(c), torch.isfinite(r)
        both = cf & rf
        if bool(both.any()):
            seen = True
            num = max(num, float((c[both] - r[both]).abs().max()))
            den = max(den, float(r[both].abs().max()))
        neither = ~cf & ~rf
        same_class = (torch.isnan(c) & torch.isnan(r)) | (neither & (c == r))  # inf == inf by sign
        mismatched += int((~both & ~same_class).sum())
    rel = (num / den if den > 0 else (0.0 if num == 0 else math.inf)) if seen else None
    return Comparison(kind is None, ref_kind is None, rel, mismatched, True, kind, ref_kind)
