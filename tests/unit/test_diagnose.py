"""One test per diagnosis rule, on evidence built directly (the CLI cases are in test_incidents)."""

from __future__ import annotations

from nan_hunter.capture.ops import OperandStats
from nan_hunter.config import DiagnosisConfig
from nan_hunter.explain.diagnose import RULES, Evidence, diagnose


def op(i=0, absmax=1.0, mn=-1.0, mx=1.0, zeros=0, neg=0, nonzero=1e-3, n=16, neginf=0, posinf=0, nan=0):
    return OperandStats(i, "float16", [n], not (neginf or posinf or nan), nan, posinf, neginf, absmax, mn, mx,
                        nonzero, zeros, neg, n)


MATRIX_FP16_ONLY = {d: {"finite": d != "fp16", "nan": 0, "posinf": 0, "neginf": 0, "absmax": 7e4,
                        "rel_err": 0.0} for d in ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "fp64")}


def ev(**kw):
    base = dict(role="producer", kind="posinf", module="m", module_type="Linear", op="aten.addmm.default",
                operands=[op(), op(1)], dtype="fp16", replay=MATRIX_FP16_ONLY, config=DiagnosisConfig(tiny_scale=1e-4, rel_err_warn=0.05))
    base.update(kw)
    return Evidence(**base)


def test_registry_names_every_cause():
    names = [n for n, _ in RULES]
    for cause in ("nonfinite_weights", "nonfinite_input", "overflow", "scale_underflow", "division_by_zero",
                  "domain_error", "masked_softmax", "unknown"):
        assert cause in names


def test_overflow_linear_numbers_and_fix():
    d = diagnose(ev(op_absmax=7e4))  # the op re-run in float64 from its operands (ops.exact_absmax)
    assert d.cause == "overflow"
    assert "7e+04 > fp16 max 65504" in d.evidence[0]
    assert sum("finite in fp32, bf16" in e for e in d.evidence) == 1  # said once, by the replay line
    assert "fp32" in d.fix and "bisect" in d.fix


def test_overflow_attention_fix_mentions_sdpa():
    d = diagnose(ev(module="layers.0.self_attn", module_type="Attention", op="aten.bmm.default"))
    assert d.cause == "overflow" and "SDPA" in d.fix and "upcast q and k" in d.fix


def test_overflow_residual_fix():
    d = diagnose(ev(module="layers.3", module_type="DecoderLayer", op="aten.add.Tensor", is_block=True))
    assert d.cause == "overflow" and "residual" in d.fix.lower() and "bf16" in d.fix


def test_overflow_in_fp8_points_at_scaling():
    d = diagnose(ev(dtype="fp8-e4m3"))
    assert d.cause == "overflow" and "scaling recipe" in d.fix


def test_scale_underflow():
    d = diagnose(ev(op="aten.reciprocal.default", operands=[op(absmax=1.7e-6, mn=1.7e-6, mx=1.7e-6,
                                                               nonzero=1.7e-6, n=1)]))
    assert d.cause == "scale_underflow" and "eps" in d.fix and "1.7e-06" in d.summary


def test_division_by_zero_notes_eps_rounding():
    d = diagnose(ev(kind="nan", op="aten.div.Tensor", operands=[op(zeros=4), op(1, zeros=1, absmax=0.0)]))
    assert d.cause == "division_by_zero"
    assert any("rounds to zero in fp16" in e for e in d.evidence)
    assert "0/0" in d.evidence[0]


def test_domain_error_log_of_negative():
    d = diagnose(ev(kind="nan", op="aten.log.default", operands=[op(neg=3, mn=-2.5)], replay=None))
    assert d.cause == "domain_error" and "-2.5" in d.evidence[0] and "clamp" in d.fix.lower()


def test_masked_softmax_all_neginf_row():
    d = diagnose(ev(kind="nan", op="aten._softmax.default", operands=[op(neginf=8)]))
    assert d.cause == "masked_softmax" and "where" in d.fix


def test_nonfinite_weights_and_input():
    w = [{"name": "a.weight", "dtype": "float32", "shape": [2, 2], "nan": 1, "posinf": 0, "neginf": 0,
          "first_index": [1, 0]}]
    d = diagnose(ev(role="weights", kind="nan", weights_nonfinite=w))
    assert d.cause == "nonfinite_weights" and "[1, 0]" in d.evidence[0]
    d = diagnose(ev(role=None, kind=None, module=None, op=None, weights_nonfinite=w))
    assert d.cause == "nonfinite_weights"
    d = diagnose(ev(role="input", kind="nan", op=None))
    assert d.cause == "nonfinite_input" and "input" in d.fix.lower()


def test_unknown_still_names_module_and_op():
    d = diagnose(ev(kind="nan", op="aten.erf.default", module="weird", operands=[op()]))
    assert d.cause == "unknown" and d.module == "weird" and d.op == "aten.erf.default"


def test_nothing_found_no_diagnosis():
    assert diagnose(ev(role=None, kind=None, op=None, weights_nonfinite=[])) is None
