"""One test per diagnosis rule, on evidence built directly (the CLI cases are in test_incidents)."""

from __future__ import annotations

import pytest

from nan_hunter.capture.ops import OperandStats
from nan_hunter.config import DiagnosisConfig
from nan_hunter.explain.diagnose import RULES, Evidence, diagnose


def op(i=0, absmax=1.0, mn=-1.0, mx=1.0, zeros=0, neg=0, nonzero=1e-3, n=16, neginf=0, posinf=0, nan=0):
    return OperandStats(
        i,
        "float16",
        [n],
        not (neginf or posinf or nan),
        nan,
        posinf,
        neginf,
        absmax,
        mn,
        mx,
        nonzero,
        zeros,
        neg,
        n,
    )


MATRIX_FP16_ONLY = {
    d: {"finite": d != "fp16", "nan": 0, "posinf": 0, "neginf": 0, "absmax": 7e4, "rel_err": 0.0}
    for d in ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "fp64")
}


def ev(**kw):
    base = dict(
        role="producer",
        kind="posinf",
        module="m",
        module_type="Linear",
        op="aten.addmm.default",
        operands=[op(), op(1)],
        dtype="fp16",
        replay=MATRIX_FP16_ONLY,
        config=DiagnosisConfig(tiny_scale=1e-4, rel_err_warn=0.05),
    )
    base.update(kw)
    return Evidence(**base)


def test_registry_names_every_cause():
    names = [n for n, _ in RULES]
    for cause in (
        "nonfinite_weights",
        "nonfinite_input",
        "overflow",
        "scale_underflow",
        "division_by_zero",
        "domain_error",
        "masked_softmax",
        "uninitialised_read",
        "unknown",
    ):
        assert cause in names


def test_uninitialised_read_is_named_before_the_arithmetic_rules():
    """The fill re-runs (``capture.fresh_fill``) set the op's mechanism: no overflow or operand rule
    claims it first, and the fix says to write or mask the memory."""
    d = diagnose(ev(kind="nan", op="aten.sum.dim_IntList", op_absmax=7e4, mechanism="uninitialised_read"))
    assert (d.cause, d.mechanism) == ("uninitialised_read", "uninitialised_read")
    assert "torch.zeros" in d.fix and "never written" in d.summary
    assert diagnose(ev(op_absmax=7e4)).cause == "overflow"


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


def _param(absmax, name="up.weight", dtype="float32"):
    o = op(1, absmax=absmax, mn=-absmax, mx=absmax)
    o.dtype, o.param = dtype, name
    return o


ALL_FAIL = {d: {**r, "finite": d == "fp64"} for d, r in MATRIX_FP16_ONLY.items()}


def test_a_cast_of_a_parameter_that_does_not_fit_names_it():
    """Autocast's cast of an fp32 weight at 2.5e5 to fp16: a cast, not a matmul, of that parameter."""
    d = diagnose(ev(op="aten._to_copy.default", operands=[_param(2.5e5)], op_absmax=2.5e5))
    assert d.cause == "overflow" and d.param == "up.weight"
    assert (
        d.summary.startswith("the cast of parameter up.weight (absmax 2.5e+05) to fp16")
        and "matmul" not in d.summary
    )
    assert "2.5e+05 > fp16 max 65504" in d.evidence[0]
    assert d.fix.startswith("Run in bf16") and "keep m in fp32" in d.fix


@pytest.mark.parametrize(
    ("name", "dtype", "replay", "proposed", "not_proposed"),
    [
        ("fp32 run, every dtype fails", "fp32", ALL_FAIL, [], ["fp32", "bf16"]),
        (
            "bf16 run, fp32 holds it",
            "bf16",
            {**ALL_FAIL, "fp32": {**ALL_FAIL["fp32"], "finite": True}},
            ["keep m in fp32"],
            ["run in bf16"],
        ),
        ("fp16 run, bf16 and fp32 hold it", "fp16", MATRIX_FP16_ONLY, ["run in bf16", "keep m in fp32"], []),
        ("fp16 run, no replay: wider ranges", "fp16", None, ["run in bf16", "keep m in fp32"], []),
        (
            "fp32 run, no replay: nothing wider",
            "fp32",
            None,
            ["no dtype has a wider range than fp32"],
            ["bf16"],
        ),
    ],
)
def test_a_fix_never_proposes_a_dtype_that_failed(name, dtype, replay, proposed, not_proposed):
    d = diagnose(ev(dtype=dtype, replay=replay, operands=[op(), _param(3e38 if dtype != "fp16" else 6e4)]))
    assert d.cause == "overflow" and d.param == "up.weight", name
    assert all(p in d.fix.lower() for p in proposed) and not any(p in d.fix for p in not_proposed), (
        name,
        d.fix,
    )


@pytest.mark.parametrize(
    "module_type, opname",
    [
        ("Attention", "aten.bmm.default"),
        ("DecoderLayer", "aten.add.Tensor"),
        ("Linear", "aten.addmm.default"),
        ("Exp", "aten.exp.default"),
    ],
)
def test_an_fp32_overflow_without_a_parameter_proposes_no_dtype(module_type, opname):
    d = diagnose(
        ev(
            dtype="fp32",
            replay=ALL_FAIL,
            module="layers.0",
            module_type=module_type,
            op=opname,
            is_block=module_type == "DecoderLayer",
        )
    )
    assert d.cause == "overflow" and d.param is None
    assert "fp32" not in d.fix and "bf16" not in d.fix, d.fix


def test_overflow_in_fp8_points_at_scaling():
    d = diagnose(ev(dtype="fp8-e4m3"))
    assert d.cause == "overflow" and "scaling recipe" in d.fix


def test_scale_underflow():
    d = diagnose(
        ev(
            op="aten.reciprocal.default",
            operands=[op(absmax=1.7e-6, mn=1.7e-6, mx=1.7e-6, nonzero=1.7e-6, n=1)],
        )
    )
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
    w = [
        {
            "name": "a.weight",
            "dtype": "float32",
            "shape": [2, 2],
            "nan": 1,
            "posinf": 0,
            "neginf": 0,
            "first_index": [1, 0],
        }
    ]
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
