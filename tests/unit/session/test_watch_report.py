"""nan_hunter/session/watch_report.py: what ``watch(...).report()`` returns, as attributes and keys."""

from __future__ import annotations

import json

import pytest

from nan_hunter.report import Diagnosis, FirstNonfinite, RunInfo
from nan_hunter.session.watch_report import WatchReport


def _report() -> WatchReport:
    f = FirstNonfinite(input_index=2, module="layers.1.gate", module_type="Gate", op="aten.div.Tensor",
                       kind="nan", role="producer", phase="backward", grad_fn="SqrtBackward0", step=2)
    d = Diagnosis("sqrt_at_zero", "fp32", "layers.1.gate", "aten.div.Tensor", "sqrt at 0", ["e1"], "add eps")
    return WatchReport(f, [{"module": "layers.1.gate"}], [2], notes=["n"], run=RunInfo(dtype="fp32", device="cpu", n_inputs=3), diagnosis=d,
                       n_forwards=4)


def test_keys_are_those_of_the_json_report():
    r = _report()
    assert r["first_nonfinite"]["module"] == "layers.1.gate" and r["first_nonfinite"]["grad_fn"] == "SqrtBackward0"
    assert r["diagnosis"]["fix"] == "add eps" and r["run"]["dtype"] == "fp32" and r["run"]["n_inputs"] == 3
    assert r["modules"] == [{"module": "layers.1.gate"}] and r["failed_inputs"] == [2] and r["n_forwards"] == 4
    assert r.first_nonfinite.step == 2 and r.diagnosis.cause == "sqrt_at_zero"  # and attributes
    assert set(r.to_dict()) == {"first_nonfinite", "diagnosis", "run", "modules", "failed_inputs", "notes",
                                "aggregates", "n_forwards", "ranks", "replay"}
    json.dumps(r.to_dict(), allow_nan=False)  # plain JSON values only


def test_a_clean_run_and_an_unknown_key():
    r = WatchReport(None, [], [])
    assert r["first_nonfinite"] is None and r["diagnosis"] is None and r["ranks"] is None
    with pytest.raises(KeyError):
        r["op_event"]  # not a key of the JSON report
