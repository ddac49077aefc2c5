"""The one rule two recordings of an entry are compared by (nan_hunter/trace/rule.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace as S

import pytest

from nan_hunter.trace.rule import MAX_SPREAD, default_rtol, rel_err, spread_of, tolerance


def st(absmax=1.0, mean=0.0, l2=1.0, nan=0, posinf=0, neginf=0):
    return S(absmax=absmax, mean=mean, l2=l2, nan=nan, posinf=posinf, neginf=neginf)


@pytest.mark.parametrize("name, a, b, want", [
    ("identical", st(), st(), 0.0),
    ("absmax 1% off", st(absmax=1.01), st(), 0.01),
    ("l2 relative to b", st(l2=2.2), st(l2=2.0), 0.1),
    ("mean near zero is measured on absmax", st(mean=1e-9, absmax=4.0), st(mean=-1e-9, absmax=4.0), 2e-9 / 4.0),
    ("same class agrees", st(nan=3), st(nan=1), 0.0),
    ("nan against finite", st(nan=1), st(), math.inf),
    ("+inf against -inf", st(posinf=1), st(neginf=1), math.inf),
    ("no finite value on one side", st(absmax=None, mean=None, l2=0.0, nan=2), st(nan=1), math.inf),
    ("tiny absmax against zero", st(absmax=1e-30, mean=0.0, l2=1e-30), st(absmax=0.0, mean=0.0, l2=0.0),
     1e-30 / 1.1754943508222875e-38),
])
def test_rel_err(name, a, b, want):
    assert rel_err(a, b, "fp32") == pytest.approx(want)


@pytest.mark.parametrize("dtypes, want", [(("fp32", "fp32"), 1e-3), (("bf16", "bf16"), 1e-2), (("fp32", "fp16"), 1e-2),
                                          (("fp8-e4m3", None), 1e-2), ((None, None), 1e-3)])
def test_default_rtol_by_dtype(dtypes, want):
    assert default_rtol(*dtypes) == want


def test_tolerance_is_at_least_four_spreads():
    assert tolerance(None, ("fp32", "fp32"), (None, None)) == 1e-3
    assert tolerance(1e-4, ("fp32", "fp32"), (0.01, None)) == pytest.approx(0.04)
    assert tolerance(0.5, ("fp32", "fp32"), (0.01, 0.02)) == 0.5


def test_spread_of_a_class_change_is_max():
    assert spread_of(st(nan=1), st(), "fp32") == MAX_SPREAD
    assert spread_of(st(absmax=1.5), st(), "fp32") == pytest.approx(0.5)
