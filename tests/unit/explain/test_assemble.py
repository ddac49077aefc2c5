"""The one assembler (``explain.assemble``): a located fault into the report, the typed ``run``
block, and the one place a diagnosis is made from located evidence."""

from __future__ import annotations

import pytest

from nan_hunter.capture.ops import OperandStats, OpEvent
from nan_hunter.config import default_config
from nan_hunter.dtypes import RunDtype
from nan_hunter.explain.assemble import Located, assemble, diagnosis_of, failed_note, input_rows
from nan_hunter.report import FirstNonfinite, Report, RunInfo


def _operand(i: int, absmax: float) -> OperandStats:
    return OperandStats(i, "fp16", [4, 4], True, 0, 0, 0, absmax, -absmax, absmax, 1.0, 0, 0, 16)


def _located() -> Located:
    first = FirstNonfinite(
        input_index=1,
        module="mlp.down",
        module_type="Linear",
        op="aten.mm.default",
        kind="posinf",
        role="producer",
    )
    ev = OpEvent(
        "aten.mm.default",
        "posinf",
        0,
        3,
        0,
        "model.py:10  y = x @ w",
        [_operand(0, 300.0), _operand(1, 400.0)],
        exact_absmax=1.2e5,
    )
    return Located(
        first,
        RunDtype.of("fp16"),
        ev,
        replay={"fp32": {"finite": True}, "fp16": {"finite": False}},
        input_label="prompt 1",
        notes=["a located note"],
    )


def test_assemble_fills_first_replay_diagnosis_and_notes():
    rep = Report(run=RunInfo(dtype="fp16", device="cpu", n_inputs=2, failed_inputs=[1]))
    assemble(rep, _located(), default_config())
    assert rep.first_nonfinite.module == "mlp.down" and rep.replay["fp16"]["finite"] is False
    assert rep.diagnosis.cause == "overflow" and rep.diagnosis.op == "aten.mm.default"
    assert "a located note" in rep.notes
    assert any("1.2e+05" in e or "1.2e5" in e or "120000" in e for e in rep.diagnosis.evidence)


def test_one_diagnosis_for_the_same_evidence_whoever_asks():
    loc = _located()
    a = diagnosis_of(loc, default_config(), [1], 2)
    b = diagnosis_of(loc, None, [1], 2)  # a watch's report: the default configuration
    assert a == b


def test_run_info_reads_as_attributes_and_keys():
    run = RunInfo(dtype="bf16", device="cpu", n_inputs=3)
    run["generate"] = {"steps": 4}
    assert run.generate == {"steps": 4} and run["dtype"] == "bf16" and run.get("nope", 7) == 7
    assert "loss" in run and run.to_dict()["failed_inputs"] == []
    with pytest.raises(KeyError):
        run["nope"] = 1
    with pytest.raises(KeyError):
        run["nope"]


def test_inputs_rows_and_failed_note():
    assert input_rows(["a", "b"], [1]) == [
        {"index": 0, "label": "a", "finite": True},
        {"index": 1, "label": "b", "finite": False},
    ]
    assert failed_note(["a", "b"], [1]) == "1 of 2 inputs produced non-finite values: #1 b"
    assert failed_note(["a"], [0]) is None
