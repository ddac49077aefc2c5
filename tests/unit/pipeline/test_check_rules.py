"""The ``check`` rules as pure functions over scan results (no model run)."""

from __future__ import annotations

from types import SimpleNamespace

from nan_hunter.config import load_config
from nan_hunter.pipeline.ci_check import forward_rules, weights_rules
from nan_hunter.report import FirstNonfinite, Report

CFG = load_config()


def tensor(name: str, absmax: float, nan: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        absmax=absmax,
        skipped=False,
        finite=nan == 0,
        nan=nan,
        posinf=0,
        neginf=0,
        first_index=[0] if nan else None,
    )


def by_rule(results):
    return {r.rule: r for r in results}


def test_weights_nonfinite_fails_and_headroom_grades():
    res = by_rule(weights_rules("ck", [tensor("a", 1.0, nan=1), tensor("b", 40000.0)], ["fp16", "bf16"], CFG))
    assert res["weights.nonfinite"].status == "fail" and "a (1 NaN" in res["weights.nonfinite"].message
    # 40000 / 65504 = 61% > fail 50% in ci.yaml
    assert res["weights.headroom.fp16"].status == "fail" and "b" in res["weights.headroom.fp16"].message
    assert res["weights.headroom.bf16"].status == "pass"


def test_weights_warn_band():
    res = by_rule(weights_rules("ck", [tensor("b", 10000.0)], ["fp16"], CFG))  # 15%: warn 10%, fail 50%
    assert res["weights.headroom.fp16"].status == "warn"


def _run(first: FirstNonfinite | None, absmax: float) -> Report:
    r = Report(first_nonfinite=first, mode="check")
    r.run = {"n_inputs": 1, "failed_inputs": [0] if first else []}
    r.modules = [{"module": "fc", "module_type": "Linear", "input_index": 0, "absmax": absmax}]
    return r


def test_a_nonfinite_forward_cannot_pass_headroom():
    bad = FirstNonfinite(
        input_index=0,
        module="fc",
        module_type="Linear",
        op="aten.addmm.default",
        kind="posinf",
        role="producer",
    )
    # the finite outputs are small (0.5% of fp16 max), but the forward went inf
    res = by_rule(forward_rules("ck", "fp16", _run(bad, 300.0), CFG))
    assert res["forward.fp16.nonfinite"].status == "fail"
    assert res["forward.fp16.headroom"].status == "fail"


def test_finite_forward_headroom_pass_and_warn():
    assert (
        by_rule(forward_rules("ck", "fp16", _run(None, 300.0), CFG))["forward.fp16.headroom"].status == "pass"
    )
    assert (
        by_rule(forward_rules("ck", "fp16", _run(None, 40000.0), CFG))["forward.fp16.headroom"].status
        == "warn"
    )
