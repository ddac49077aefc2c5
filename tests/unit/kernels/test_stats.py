"""kernels/stats.py: a stats row as Python data — fields a fast path skipped (-1, NaN) read as
None, the three non-finite counts always numbers, the first non-finite class by severity, the mean
over finite values, flush counts per target dtype, JSON without infinities; ``--stats`` checked."""

from __future__ import annotations

import math

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.kernels.stats import (
    FLOAT_FIELDS,
    INT_FIELDS,
    N_FLOAT,
    N_INT,
    OVER_FIELDS,
    STATS_LEVELS,
    UNDER_FIELDS,
    TensorStats,
    parse_stats_level,
)


def _row(**kw) -> TensorStats:
    ints = [kw.get(f, -1 if f not in ("numel", "nan", "posinf", "neginf") else 0) for f in INT_FIELDS]
    floats = [kw.get(f, math.nan) for f in FLOAT_FIELDS]
    return TensorStats.from_row(ints, floats)


def test_the_row_layout():
    assert (N_INT, N_FLOAT) == (len(INT_FIELDS), len(FLOAT_FIELDS)) == (15, 4)
    assert set(OVER_FIELDS) | set(UNDER_FIELDS) <= set(INT_FIELDS)


def test_skipped_fields_read_as_none():
    s = _row(numel=8, nan=-1, absmax=2.0)
    assert (s.numel, s.zero, s.under_fp16, s.first_nonfinite, s.min_nonzero, s.sum) == (
        8,
        None,
        None,
        None,
        None,
        None,
    )
    assert (s.nan, s.posinf, s.neginf, s.absmax) == (0, 0, 0, 2.0)  # the counts are always computed


@pytest.mark.parametrize(
    "nan, posinf, neginf, kind", [(0, 0, 0, None), (1, 1, 1, "nan"), (0, 3, 1, "posinf"), (0, 0, 2, "neginf")]
)
def test_kind_by_severity(nan, posinf, neginf, kind):
    s = _row(numel=10, nan=nan, posinf=posinf, neginf=neginf)
    assert s.kind == kind and s.finite is (kind is None)


@pytest.mark.parametrize(
    "numel, bad, total, mean",
    [
        (4, 0, 10.0, 2.5),
        (4, 1, 9.0, 3.0),  # over the finite values only
        (2, 2, 0.0, None),  # none finite
        (0, 0, 0.0, None),  # empty
        (4, 0, None, None),  # the sum was not computed
    ],
)
def test_mean(numel, bad, total, mean):
    s = TensorStats(numel=numel, nan=bad, sum=total)
    assert s.mean == mean


@pytest.mark.parametrize(
    "target, field",
    [
        ("fp16", "under_fp16"),
        ("bf16", "under_bf16"),
        ("fp8-e4m3", "under_e4m3"),
        ("fp8-e5m2", "under_e5m2"),
        ("half", "under_fp16"),
    ],
)
def test_flushed_per_target(target, field):
    s = TensorStats(numel=4, **{field: 3})
    assert s.flushed(target) == 3


def test_to_dict_has_no_infinity():
    d = _row(numel=1, absmax=0.0, min_nonzero=math.inf, sum=math.inf, sumsq=1.0).to_dict()
    assert (d["min_nonzero"], d["sum"], d["sumsq"], d["absmax"]) == (None, None, 1.0, 0.0)
    assert list(d) == [*INT_FIELDS, *FLOAT_FIELDS]


@pytest.mark.parametrize("value", STATS_LEVELS)
def test_stats_levels(value):
    assert parse_stats_level(value) == value


@pytest.mark.parametrize("value", ["Fast", "exact", ""])
def test_bad_stats_level(value):
    with pytest.raises(BadInput, match="use fast or full"):
        parse_stats_level(value)
