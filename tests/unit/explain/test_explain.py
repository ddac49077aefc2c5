"""``explain.assemble.explain``: a fault whose re-run was finite is diagnosed ``not_reproducible``."""

from __future__ import annotations

from nan_hunter.dtypes import RunDtype
from nan_hunter.explain.assemble import explain
from nan_hunter.locate.located import Located
from nan_hunter.report import Diagnosis, FirstNonfinite


def first(reproducible: bool | None, op: str | None = "aten.exp.default") -> FirstNonfinite:
    return FirstNonfinite(
        input_index=0,
        module="layers.0.act",
        module_type="Act",
        op=op,
        kind="posinf",
        role="producer",
        reproducible=reproducible,
    )


def overflow() -> Diagnosis:
    return Diagnosis(
        cause="overflow",
        dtype="bf16",
        module="layers.0.act",
        op="aten.exp.default",
        summary="exp overflowed bf16",
        evidence=["e"],
        fix="f",
    )


def verdict(
    reproducible: bool | None, run: str = "fp32", op: str | None = "aten.exp.default", device: str = "cpu"
) -> Diagnosis | None:
    """The diagnosis ``explain`` makes of a located fault (no replay: the evidence alone)."""
    loc = Located(first(reproducible, op), RunDtype.of(run))
    explain(loc, None, [0], 1, replay=False, device=device)
    return loc.diagnosis


def test_a_finite_rerun_names_the_device_and_keeps_the_original_cause_as_evidence():
    d = verdict(False, run="bf16", device="cuda:3")
    assert d.cause == "not_reproducible" and d.dtype == "bf16"
    assert (d.module, d.op) == ("layers.0.act", "aten.exp.default")
    assert "device cuda:3" in d.summary and "rank" not in d.summary  # no process group: no rank
    assert (
        d.evidence[0] == "the first non-finite value (posinf) appeared at aten.exp.default in layers.0.act "
        "during the run"
    )
    assert d.evidence[-1].startswith("what the captured values alone suggest: ")


def test_the_rank_is_named_when_given():
    loc = Located(first(False), RunDtype.of("fp16"))
    explain(loc, None, [0], 1, replay=False, device="cuda:1", rank=3)
    assert "device cuda:1, rank 3" in loc.diagnosis.summary


def test_without_an_op_the_module_is_named():
    d = verdict(False, run="fp16", op=None)
    assert d.cause == "not_reproducible" and d.dtype == "fp16" and d.op is None
    assert "(fp16)" in d.evidence[1]
    assert d.summary.startswith("layers.0.act produced a non-finite value")


def test_a_reproduced_or_unchecked_fault_keeps_its_diagnosis():
    for r in (True, None):
        loc = Located(first(r), RunDtype.of("fp32"), diagnosis=overflow())
        explain(loc, None, [0], 1, replay=False)
        assert loc.diagnosis == overflow()


def test_a_diagnosis_made_already_is_not_made_again():
    loc = Located(first(False), RunDtype.of("fp32"), diagnosis=overflow())  # e.g. by the rank that located it
    explain(loc, None, [0], 1, replay=False)
    assert loc.diagnosis == overflow()
