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
    q = {
        "name": HOSTILE,
        "format": "fp8_block",
        "scale": HOSTILE + "_scale_inv",
        "n_blocks": 4,
        "n_bad": 1,
        "bad_blocks": [{"index": [1, 0], "scale": "nan", "problem": "nan"}],
        "dequant_absmax": 3.0,
        "overflows": {"fp16": False, "bf16": False},
    }
    w = {
        "n_tensors": 2,
        "nonfinite": [],
        "quantized": [q],
        "suspicious": [{"name": "z", "reason": "all_zero", "absmax": 0.0}],
        "unchecked": [{"name": "c", "dtype": "complex64", "reason": "complex"}],
        "tensors": [],
    }
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


def test_zero_point_and_gguf_rows():
    rep = _report()
    rep.weights["quantized"] = [
        {
            "name": "l.qweight",
            "format": "gptq",
            "scale": "l.scales",
            "n_blocks": 8,
            "n_bad": 1,
            "bad_blocks": [
                {
                    "index": [0, 0],
                    "scale": 0.01,
                    "problem": "zero_point",
                    "zero_point": 8,
                    "expected": 7,
                    "declared": "gptq",
                    "found": "gptq_v2",
                    "n_groups": 8,
                }
            ],
            "dequant_absmax": 1.0,
            "overflows": {"fp16": False, "bf16": False},
        },
        {
            "name": "blk.0",
            "format": "gguf:Q4_K",
            "scale": "blk.0",
            "n_blocks": 4,
            "n_bad": 1,
            "bad_blocks": [{"index": [1, 2], "scale": "inf", "problem": "inf", "field": "dmin"}],
            "dequant_absmax": 1.0,
            "overflows": {"fp16": False, "bf16": None},
        },
    ]
    rep.diagnosis = Diagnosis(
        "bad_zero_point", None, None, None, "GPTQ weight l.qweight is declared 'gptq'", [], "fix"
    )
    rows, _ = quantized_rows(rep)
    assert rows[0][5] == "zero point 8 (stored as gptq_v2, declared gptq; 8 groups)"
    assert rows[1][2] == "blk.0 (dmin)" and rows[1][3] == "[1, 2]"
    assert "bad_zero_point" in verdict(rep).text and rep.exit_code() == 1
    page = render_html([rep], [(None, "no plot")])
    assert "stored as gptq_v2" in page and "blk.0 (dmin)" in page
