"""explain/fix_check: which causes have a mechanical fix, and the compile re-run as a fix."""

from __future__ import annotations

import math

import pytest

from nan_hunter.explain.fix_check import from_emulate_precision_casts, no_mechanical_fix, with_verdict
from nan_hunter.report import Diagnosis, FixVerified


@pytest.mark.parametrize("cause", ["overflow", "division_by_zero", "scale_underflow", "masked_softmax",
                                   "compile_divergence"])
def test_mechanical_causes(cause):
    assert no_mechanical_fix(cause) is None


@pytest.mark.parametrize("cause", ["nonfinite_input", "nonfinite_weights", "bad_scale", "not_reproducible",
                                   "domain_error", "unknown", "a_cause_added_later"])
def test_causes_without_a_mechanical_fix_say_why(cause):
    assert no_mechanical_fix(cause)


def test_emulate_precision_casts_as_a_verified_fix():
    ok = from_emulate_precision_casts({"compiled_finite": True, "max_rel_err": 1e-3}, rtol=1e-2)
    assert ok == FixVerified("torch._inductor.config.emulate_precision_casts = True", True, 1e-3, "model", "eager")
    far = from_emulate_precision_casts({"compiled_finite": True, "max_rel_err": 0.5}, rtol=1e-2)
    assert far is not None and not far.finite
    bad = from_emulate_precision_casts({"compiled_finite": False, "max_rel_err": math.inf}, rtol=1e-2)
    assert bad is not None and not bad.finite and bad.max_rel_err is None
    assert from_emulate_precision_casts(None, 1e-2) is None


def test_fix_text_says_verified_only_when_finite():
    d = Diagnosis("overflow", "fp16", "fc", None, "s", [], "Keep fc in fp32.")
    with_verdict(d, FixVerified("keep fc in fp32", False, None))
    assert "verified" not in d.fix.lower() and d.fix_verified.finite is False
    with_verdict(d, FixVerified("keep fc in fp32", True, 0.0))
    assert d.fix.endswith("Verified: keep fc in fp32 makes the failing input finite, max rel err 0 vs fp32.")
