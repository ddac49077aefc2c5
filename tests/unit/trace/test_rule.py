"""The one rule two recordings of an entry are compared by (nan_hunter/trace/rule.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace as S

import pytest

from nan_hunter.trace.rule import MAX_SPREAD, default_rtol, rel_err, spread_of, tolerance


def st(absmax=1.0, mean=0.0, l2=1.0, nan=0, posinf=0, neginf=0):
    return S(absmax=absmax, mean=mean, l2=l2, nan=nan, posinf=posinf, neginf=neginf)


@pytest.mark.parametrize(
    "name, a, b, want",
    [
        ("identical", st(), st(), 0.0),
        ("absmax 1% off, relative to the larger side", st(absmax=1.01), st(), 0.01 / 1.01),
        ("l2 relative to the larger side", st(l2=2.2), st(l2=2.0), 0.2 / 2.2),
        (
            "mean near zero is measured on absmax",
            st(mean=1e-9, absmax=4.0),
            st(mean=-1e-9, absmax=4.0),
            2e-9 / 4.0,
        ),
        (
            "a value against zero is 1 apart",
            st(absmax=1.0, mean=0.5, l2=1.0),
            st(absmax=0.0, mean=0.0, l2=0.0),
            1.0,
        ),
        ("same class agrees", st(nan=3), st(nan=1), 0.0),
        ("nan against finite", st(nan=1), st(), math.inf),
        ("+inf against -inf", st(posinf=1), st(neginf=1), math.inf),
        ("no finite value on one side", st(absmax=None, mean=None, l2=0.0, nan=2), st(nan=1), math.inf),
        (
            "a normal value against zero",
            st(absmax=1e-30, mean=0.0, l2=1e-30),
            st(absmax=0.0, mean=0.0, l2=0.0),
            1.0,
        ),
        (
            "smallest subnormal against zero agrees",
            st(absmax=2**-149, mean=2**-149, l2=2**-149),
            st(absmax=0.0, mean=0.0, l2=0.0),
            0.0,
        ),
        (
            "just below the smallest normal against zero agrees",
            st(absmax=1.1e-38, mean=1e-39, l2=1.1e-38),
            st(absmax=0.0, mean=0.0, l2=0.0),
            0.0,
        ),
    ],
)
def test_rel_err(name, a, b, want):
    assert rel_err(a, b, "fp32") == pytest.approx(want)


def test_rel_err_is_symmetric():
    a, b = st(absmax=3.0, mean=0.5, l2=7.0), st(absmax=2.0, mean=-0.5, l2=6.0)
    assert rel_err(a, b, "fp32") == rel_err(b, a, "fp32")


@pytest.mark.parametrize(
    "dtype, diff, agrees",
    [("fp16", 6e-5, True), ("fp16", 7e-5, False), ("bf16", 1e-38, True), ("fp32", 2e-38, False)],
)
def test_the_floor_is_the_dtypes_smallest_normal(dtype, diff, agrees):
    assert (
        rel_err(st(absmax=diff, mean=0.0, l2=diff), st(absmax=0.0, mean=0.0, l2=0.0), dtype) == 0.0
    ) is agrees


@pytest.mark.parametrize(
    "dtypes, want",
    [
        (("fp32", "fp32"), 1e-3),
        (("bf16", "bf16"), 1e-2),
        (("fp32", "fp16"), 1e-2),
        (("fp8-e4m3", None), 1e-2),
        ((None, None), 1e-3),
    ],
)
def test_default_rtol_by_dtype(dtypes, want):
    assert default_rtol(*dtypes) == want


def test_tolerance_is_at_least_four_spreads():
    assert tolerance(None, ("fp32", "fp32"), (None, None)) == 1e-3
    assert tolerance(1e-4, ("fp32", "fp32"), (0.01, None)) == pytest.approx(0.04)
    assert tolerance(0.5, ("fp32", "fp32"), (0.01, 0.02)) == 0.5


def test_spread_of_a_class_change_is_max():
    assert spread_of(st(nan=1), st(), "fp32") == MAX_SPREAD
    assert spread_of(st(absmax=1.5), st(), "fp32") == pytest.approx(0.5 / 1.5)
