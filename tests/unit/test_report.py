"""Report v1 serialisation: every contract key present, strict JSON, exit codes."""

from __future__ import annotations

import json
import math

import pytest

from nan_hunter.report import (
    SCHEMA,
    BisectResult,
    CompileResult,
    Diagnosis,
    FirstNonfinite,
    ModuleRow,
    ReplayRow,
    Report,
    json_text,
    module_rows_from_json,
    replay_from_json,
    replay_json,
    rows_json,
)

V1_KEYS = {
    "schema",
    "nanhunter_version",
    "torch_version",
    "checkpoint",
    "weights",
    "run",
    "first_nonfinite",
    "replay",
    "diagnosis",
}


def test_empty_report_has_every_v1_key_null_where_not_applicable():
    d = json.loads(json_text(Report(checkpoint={"path": "x"})))
    assert V1_KEYS <= set(d) and d["schema"] == SCHEMA == "nanhunter.report/v1"
    assert (
        d["run"] is None and d["first_nonfinite"] is None and d["replay"] is None and d["diagnosis"] is None
    )


def test_nonfinite_floats_become_null_and_the_json_is_strict():
    rep = Report(replay={"fp16": {"finite": False, "absmax": math.inf, "rel_err": math.nan}})
    text = json_text(rep)
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["replay"]["fp16"] == {"finite": False, "absmax": None, "rel_err": None}


def test_replay_rows_are_typed_and_keyed_and_json_at_the_edge():
    """issue 44: a replay row is a dataclass; its keys read as the dict it replaced did, and its JSON
    has the contract's six keys (``error`` only when a dtype's run raised)."""
    ok, bad = ReplayRow(True, absmax=2.0, rel_err=math.inf), ReplayRow(False, error="RuntimeError: no kernel")
    assert ok["finite"] is True and ok.get("error") is None and "error" not in ok and dict(ok) == ok.to_dict()
    assert set(ok.to_dict()) == {"finite", "nan", "posinf", "neginf", "absmax", "rel_err"}
    assert bad.to_dict()["error"] == "RuntimeError: no kernel" and bad["error"] == bad.error
    d = json.loads(json_text(Report(replay={"fp32": ok, "fp16": bad})))
    assert d["replay"]["fp32"] == {
        "finite": True,
        "nan": 0,
        "posinf": 0,
        "neginf": 0,
        "absmax": 2.0,
        "rel_err": None,
    }
    assert replay_from_json(replay_json({"fp16": bad})) == {"fp16": bad} and replay_json(None) is None


def test_the_compile_block_is_typed_with_the_contract_keys():
    c = CompileResult("inductor", eager_finite=True, compiled_finite=False, max_rel_err=math.inf)
    c.first_divergent_module = "layers.0"
    assert c["backend"] == "inductor" and {**c}["first_divergent_module"] == "layers.0"
    d = json.loads(json_text(Report(compile=c)))["compile"]
    assert d == {
        "backend": "inductor",
        "eager_finite": True,
        "compiled_finite": False,
        "first_divergent_module": "layers.0",
        "max_rel_err": None,
        "emulate_precision_casts": None,
    }


def test_module_rows_are_typed_and_their_json_keys_are_as_before():
    """issue 44: ``phase`` only for backward and optimizer rows, ``param`` only for an optimizer row,
    ``step`` only under --generate, as the dict rows had them."""
    fwd = ModuleRow("layers.0", "Linear", 0, 2, 1, 3.0, 1.0, 0, 1, 0, 0.5, None, {"fp16": 0.0})
    opt = ModuleRow(
        "layers.0", "Linear", 0, 2, 1, 3.0, 1.0, 0, 0, 0, 0.5, None, {}, phase="optimizer", param="w"
    )
    assert "phase" not in fwd and fwd.get("phase", "forward") == "forward" and fwd["posinf"] == 1
    assert (
        list(fwd.to_dict())[-1] == "flush_frac"
        and opt.to_dict()["phase"] == "optimizer"
        and opt["param"] == "w"
    )
    fwd["step"], fwd["input_index"] = fwd["input_index"], 0  # what --generate does to a row
    assert fwd.to_dict()["step"] == 2 and fwd.input_index == 0
    with pytest.raises(KeyError):
        fwd["no_such_key"] = 1
    d = json.loads(json_text(Report(modules=[fwd, opt])))["modules"]
    assert module_rows_from_json(d) == [fwd, opt] and rows_json(None) is None


def test_first_nonfinite_and_diagnosis_round_trip():
    f = FirstNonfinite(
        input_index=2,
        module="layers.1.mlp",
        module_type="MLP",
        op="aten.addmm.default",
        kind="posinf",
        role="producer",
    )
    dg = Diagnosis("overflow", "fp16", "layers.1.mlp", "aten.addmm.default", "s", ["e"], "fix")
    d = json.loads(json_text(Report(first_nonfinite=f, diagnosis=dg)))
    assert d["first_nonfinite"]["module"] == "layers.1.mlp" and d["first_nonfinite"]["kind"] == "posinf"
    assert d["diagnosis"]["cause"] == "overflow" and d["diagnosis"]["evidence"] == ["e"]


def test_exit_codes():
    assert Report().exit_code() == 0
    assert Report(weights={"nonfinite": [{"name": "w"}]}).exit_code() == 1
    bad = FirstNonfinite(input_index=0, module="", module_type="M", op=None, kind="nan", role="producer")
    assert Report(first_nonfinite=bad).exit_code() == 1
    assert Report(bisect=BisectResult("fp16", "fp32", [], 3, True, 0.0)).exit_code() == 0
    assert Report(bisect=BisectResult("fp16", "fp32", [], 3, False, None)).exit_code() == 1
    assert Report(check={"passed": False}).exit_code() == 1


def test_a_list_of_reports_is_a_json_array():
    d = json.loads(json_text([Report(), Report()]))
    assert isinstance(d, list) and len(d) == 2 and all(r["schema"] == SCHEMA for r in d)


def test_torch_version_is_torchs_own_or_none(monkeypatch):
    """``torch_version``: ``torch.__version__`` when torch is loaded; None when torch is not installed
    (read from the installed package without importing it: tests/unit/test_import_graph.py::test_torch_free_parts_load_no_torch)."""
    import importlib.util
    import sys

    import torch

    from nan_hunter.report import torch_version

    assert torch_version() == torch.__version__
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert torch_version() is None
