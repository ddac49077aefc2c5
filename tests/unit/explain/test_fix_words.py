"""What the reports say about fixes: the causes with a mechanical fix, why the others have none, and
why a fix with a change went unverified (``explain/fix_words.py``, read by the terminal view)."""

from __future__ import annotations

import pytest

from nan_hunter.explain import fix_check
from nan_hunter.explain.fix_words import MECHANICAL, NO_FIX, UNVERIFIED, no_mechanical_fix


@pytest.mark.parametrize(
    "cause", ["overflow", "division_by_zero", "scale_underflow", "masked_softmax", "compile_divergence"]
)
def test_mechanical_causes(cause):
    assert no_mechanical_fix(cause) is None


@pytest.mark.parametrize(
    "cause",
    [
        "nonfinite_input",
        "nonfinite_weights",
        "bad_scale",
        "not_reproducible",
        "domain_error",
        "unknown",
        "uninitialised_read",
        "a_cause_added_later",
    ],
)
def test_causes_without_a_mechanical_fix_say_why(cause):
    assert no_mechanical_fix(cause)


def test_a_zero_point_convention_is_fixed_by_a_re_export():
    assert "checkpoint_format" in no_mechanical_fix("bad_zero_point")


def test_every_cause_is_mechanical_or_says_why_not():
    assert not set(MECHANICAL) & set(NO_FIX)
    assert all(v and "\n" not in v for v in NO_FIX.values())


def test_unverified_reasons_are_the_ones_fix_check_gives():
    """``fix_check.verdict`` returns a key of ``UNVERIFIED`` when a fix goes unverified; the words are one
    line each, and fix_check re-exports the same objects (one definition)."""
    assert set(UNVERIFIED) == {"no_change", "control_finite", "not_applicable", "not_rerun"}
    assert all("\n" not in v for v in UNVERIFIED.values())
    assert fix_check.UNVERIFIED is UNVERIFIED and fix_check.no_mechanical_fix is no_mechanical_fix
    assert all(c in MECHANICAL or no_mechanical_fix(c) for c in ("overflow", "unknown", "bad_scale"))
