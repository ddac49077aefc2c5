"""nan_hunter/session/reproduce.py: a finite re-run turns the diagnosis into ``not_reproducible``."""

from __future__ import annotations

from nan_hunter.report import Diagnosis, FirstNonfinite, Report, RunInfo
from nan_hunter.session.reproduce import reproducible_verdict


def first(reproducible: bool | None, op: str | None = "aten.exp.default") -> FirstNonfinite:
    return FirstNonfinite(input_index=0, module="layers.0.act", module_type="Act", op=op, kind="posinf",
                          role="producer", reproducible=reproducible)


def overflow() -> Diagnosis:
    return Diagnosis(cause="overflow", dtype="bf16", module="layers.0.act", op="aten.exp.default",
                     summary="exp overflowed bf16", evidence=["e"], fix="f")


def test_a_finite_rerun_names_the_device_and_keeps_the_original_cause_as_evidence():
    rep = Report(run=RunInfo(dtype="fp32", device="cpu", n_inputs=1), first_nonfinite=first(False),
                 diagnosis=overflow())
    reproducible_verdict(rep, "cuda:3")
    d = rep.diagnosis
    assert d.cause == "not_reproducible" and d.dtype == "bf16"  # the diagnosis's dtype wins over the run's
    assert (d.module, d.op) == ("layers.0.act", "aten.exp.default")
    assert "device cuda:3" in d.summary and "rank" not in d.summary  # no process group: no rank
    assert d.evidence[0] == "the first non-finite value (posinf) appeared at aten.exp.default in layers.0.act " \
                            "during the run"
    assert d.evidence[-1] == "what the captured values alone suggest: overflow (exp overflowed bf16)"


def test_without_a_diagnosis_the_run_dtype_is_named():
    rep = Report(run=RunInfo(dtype="fp16", device="cpu", n_inputs=1), first_nonfinite=first(False, op=None))
    reproducible_verdict(rep, "cpu")
    d = rep.diagnosis
    assert d.cause == "not_reproducible" and d.dtype == "fp16" and d.op is None
    assert len(d.evidence) == 2 and "(fp16)" in d.evidence[1]
    assert d.summary.startswith("layers.0.act produced a non-finite value")


def test_a_reproduced_or_unchecked_fault_and_a_clean_run_are_left_alone():
    for r in (True, None):
        rep = Report(first_nonfinite=first(r), diagnosis=overflow())
        reproducible_verdict(rep, "cpu")
        assert rep.diagnosis == overflow()
    rep = Report(run=RunInfo(dtype="fp32", device="cpu", n_inputs=1))
    reproducible_verdict(rep, "cpu")
    assert rep.diagnosis is None
