"""Abs-min beside abs-max per module row (JSON ``modules[i].min_nonzero``, ``subnormal_frac``), in
the terminal strip at 80 and 120 columns, in HTML; captures of a shipped incident at both widths."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from nan_hunter.pipeline.scan_checkpoint import scan
from nan_hunter.render.html import render_html
from nan_hunter.render.rows import cells, verdict
from nan_hunter.render.terminal import render

ROOT = Path(__file__).resolve().parents[2]
INC = ROOT / "examples/incidents/eps_underflow"


@pytest.fixture(scope="module")
def rep():
    return scan(str(INC / "model.safetensors"), arch=f"{INC / 'model.py'}:build",
                inputs=[str(INC / "inputs.safetensors")], dtype="fp16", device="cpu")


def test_rows_carry_abs_min(rep):
    norm = next(m for m in rep.modules if m["module"] == "norm")
    assert 0 < norm["min_nonzero"] <= norm["absmax"] and norm["subnormal_frac"] == 0.0
    d = rep.to_dict()
    assert all("min_nonzero" in m and "subnormal_frac" in m for m in d["modules"])


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_capture(rep, width):
    buf = io.StringIO()
    render(rep, Console(file=buf, width=width, markup=False, emoji=False, highlight=False), strip=True)
    text = buf.getvalue()
    lines = text.splitlines()
    v = verdict(rep).text
    assert v == "✘ division_by_zero: NaN first produced by norm at aten.div.Tensor (fp16)"
    assert lines[3] == v and lines[-1] == v  # after the 3 header lines, and at the end
    assert all(cells(line) <= width for line in lines)
    strip_head = next(line for line in lines if "abs-min" in line)
    assert "absmax" in strip_head and "headroom" in strip_head
    assert any("0.007282" in line and "norm" in line for line in lines)
    assert sum("replay: finite in fp32" in line for line in lines) == 1  # said once
    assert "✔ verified on a copy of the whole model: an eps fp16 can hold" in " ".join(
        " ".join(line.strip("│ ").split()) for line in lines)


def test_html_strip_has_abs_min(rep):
    page = render_html([rep], [(None, "no plot")])
    assert "<th class=num>abs-min</th>" in page and "0.007282" in page
