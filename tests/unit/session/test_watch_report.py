"""nan_hunter/session/watch_report.py: what ``watch(...).report()`` returns, the report v1 as every
command's (printable), its fields as attributes and keys, the watch's extras as extra keys."""

from __future__ import annotations

import json

import pytest

from nan_hunter.render.report_view import PrintableReport
from nan_hunter.render.terminal import render_text
from nan_hunter.report import SCHEMA, Diagnosis, FirstNonfinite, Report, RunInfo, json_text
from nan_hunter.session.watch_report import WATCH_CHECKPOINT, WATCH_KEYS, WatchReport


def _report() -> WatchReport:
    f = FirstNonfinite(
        input_index=2,
        module="layers.1.gate",
        module_type="Gate",
        op="aten.div.Tensor",
        kind="nan",
        role="producer",
        phase="backward",
        grad_fn="SqrtBackward0",
        step=2,
    )
    d = Diagnosis("sqrt_at_zero", "fp32", "layers.1.gate", "aten.div.Tensor", "sqrt at 0", ["e1"], "add eps")
    rep = Report(
        checkpoint=dict(WATCH_CHECKPOINT),
        mode="watch",
        first_nonfinite=f,
        diagnosis=d,
        notes=["n"],
        run=RunInfo(dtype="fp32", device="cpu", n_inputs=4, failed_inputs=[2]),
        modules=[{"module": "layers.1.gate"}],
    )
    return WatchReport(rep, aggregates=[{"module": "layers.0"}])


def test_keys_are_those_of_the_json_report():
    r = _report()
    assert (
        r["first_nonfinite"]["module"] == "layers.1.gate"
        and r["first_nonfinite"]["grad_fn"] == "SqrtBackward0"
    )
    assert r["diagnosis"]["fix"] == "add eps" and r["run"]["dtype"] == "fp32" and r["run"]["n_inputs"] == 4
    assert (
        r["modules"] == [{"module": "layers.1.gate"}] and r["failed_inputs"] == [2] and r["n_forwards"] == 4
    )
    assert r.first_nonfinite.step == 2 and r.diagnosis.cause == "sqrt_at_zero"  # and attributes
    d = r.to_dict()
    assert d["schema"] == SCHEMA and r["schema"] == SCHEMA and d["mode"] == "watch"  # issue 44: report v1
    assert set(d) == set(Report(mode="watch").to_dict()) | set(
        WATCH_KEYS
    )  # v1's keys, the extras beside them
    assert {k: d[k] for k in WATCH_KEYS} == {
        "failed_inputs": [2],
        "n_forwards": 4,
        "aggregates": [{"module": "layers.0"}],
        "ranks": None,
    }
    json.dumps(d, allow_nan=False)  # plain JSON values only


def test_a_clean_run_and_an_unknown_key():
    r = WatchReport(Report(run=RunInfo(dtype=None, device="cpu", n_inputs=0), mode="watch"))
    assert r["first_nonfinite"] is None and r["diagnosis"] is None and r["ranks"] is None
    with pytest.raises(KeyError):
        r["op_event"]  # not a key of the JSON report


def test_one_printable_report_type():
    """issue 44: the type scan, bisect and check reports print as; the JSON it writes is its to_dict()."""
    r = _report().replaced(modules=None)  # (its one row is not a whole row of the module table)
    assert isinstance(r, PrintableReport) and isinstance(r, Report)
    assert str(r) == r.render() and r.render(90) == render_text(r, 90, strip=True)
    assert "layers.1.gate" in r.render(90)
    assert json.loads(json_text(r)) == r.to_dict()


def test_non_finite_aggregates_are_null_in_json():
    r = WatchReport(
        Report(run=RunInfo(dtype=None, device="cpu", n_inputs=1), mode="watch"),
        aggregates=[{"module": "a", "absmax": float("inf")}],
    )
    assert r.to_dict()["aggregates"] == [{"module": "a", "absmax": None}] and r.aggregates[0][
        "absmax"
    ] == float("inf")


def test_a_view_not_a_second_report():
    r = _report()
    assert r.as_report() is r.report and r.calls is r.report.modules and r.notes is r.report.notes
    assert r.failed_inputs == [2] and r.n_forwards == 4 and r.aggregates == [{"module": "layers.0"}]
    assert r.op_event is None and r.optimizer_facts is None and r.op_missing is None  # nothing located here
    g = r.replaced(ranks=[{"rank": 0}], notes=["rank 0: n"])
    assert (
        g.notes == ["rank 0: n"] and r.notes == ["n"] and g.ranks == [{"rank": 0}]
    )  # a copy: the local one stays
    assert g.first_nonfinite is r.first_nonfinite and g.aggregates == r.aggregates


def test_forecast_and_warnings_are_the_reports():
    from nan_hunter.report import Report
    from nan_hunter.session.watch_report import WatchReport

    rep = Report(mode="watch")
    rep.forecast, rep.warnings = (
        [],
        [{"code": "grad_norm_spike", "step": 3, "module": None, "evidence": [], "fix": ""}],
    )
    view = WatchReport(rep)
    assert view.forecast == [] and view["warnings"] == rep.warnings
    assert rep.to_dict()["forecast"] == [] and "forecast" not in Report().to_dict()
