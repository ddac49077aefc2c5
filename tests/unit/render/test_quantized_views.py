"""The HTML, Markdown and terminal views show quantized bad blocks, suspicious and unchecked
tensors, names escaped (contract v1.2 "Every checkpoint format")."""

from __future__ import annotations

from nan_hunter.explain.diagnose import Diagnosis
from nan_hunter.render.html import render_html
from nan_hunter.render.markdown import render_markdown
from nan_hunter.render.rows import caveat_rows, quantized_rows, verdict
from nan_hunter.report import Report

HOSTILE = "<script>alert(1)</script>.weight"


def _report() -> Report:
    q = {"name": HOSTILE, "format": "fp8_block", "scale": HOSTILE + "_scale_inv", "n_blocks": 4, "n_bad": 1,
         "bad_blocks": [{"index": [1, 0], "scale": "nan", "problem": "nan"}], "dequant_absmax": 3.0,
         "overflows": {"fp16": False, "bf16": False}}
    w = {"n_tensors": 2, "nonfinite": [], "quantized": [q], "suspicious": [{"name": "z", "reason": "all_zero",
                                                                           "absmax": 0.0}],
         "unchecked": [{"name": "c", "dtype": "complex64", "reason": "complex"}], "tensors": []}
    rep = Report(checkpoint={"path": "x", "format": "safetensors", "n_tensors": 2, "bytes": 8}, weights=w)
    rep.diagnosis = Diagnosis("bad_scale", None, None, None, "bad", [], "fix")
    return rep


def test_rows_and_verdict():
    rep = _report()
    rows, hidden = quantized_rows(rep)
    assert rows == [[HOSTILE, "fp8_block", HOSTILE + "_scale_inv", "[1, 0]", "nan", "nan"]] and hidden == 0
    assert [r[0] for r in caveat_rows(rep)] == ["z", "c"]
    v = verdict(rep)
    assert v.tone == "bad" and "bad_scale" in v.text and rep.exit_code() == 1


def test_html_and_markdown_show_bad_blocks_escaped():
    rep = _report()
    page = render_html([rep], [(None, "no plot")])
    assert "Quantized weights: bad blocks" in page and "<script>alert" not in page
    assert "&lt;script&gt;" in page and "[1, 0]" in page and "not checked: complex" in page
    md = render_markdown([rep], [(None, "no plot")])
    assert "Quantized weights: bad blocks" in md and "<script>" not in md


def test_clean_weights_with_unchecked_never_bare_clean():
    rep = _report()
    rep.weights["quantized"], rep.diagnosis = [], None
    v = verdict(rep)
    assert "1 tensor not checked" in v.text and v.tone == "warn"
