"""render/terminal/scan_view.py: the scan's panels — header, weights tables, producer panel with
the calls that led to it, diagnosis panel with its replay table, findings, the verdict line (≤ 79
cells, never wrapped) and bisect's keep lines; untrusted strings shown, never interpreted."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from nan_hunter.render.terminal.scan_view import (
    bisect_view,
    diagnosis_panel,
    findings,
    header,
    producer_panel,
    replay_table,
    t,
    verdict,
    weights_tables,
)
from nan_hunter.report import Report

from ..reports import bisect, clean, nan_weights, overflow
from .console import text_of


def test_header():
    assert [line.rstrip() for line in text_of(header(overflow(), 100), 100).splitlines()] == [
        "nanhunter model.safetensors",
        "          safetensors · 4 tensors · 0.2 KB",
        "run       fp16 on cpu · 1 input(s) · failing inputs [0]",
    ]
    assert len(text_of(header(nan_weights(), 100), 100).splitlines()) == 2  # no run: no run line


def test_weights_tables():
    out = "\n".join(text_of(w, 100) for w in weights_tables(nan_weights(), 100))
    assert "weights: non-finite" in out and "weights: near a dtype's max" in out
    bad = next(line for line in out.splitlines() if line.startswith("up.weight"))
    assert bad.split() == ["up.weight", "float32", "[4,", "4]", "1", "0", "0", "[1,", "2]"]
    assert weights_tables(Report(weights={"n_tensors": 1, "nonfinite": []}), 100) == []


def test_producer_panel_names_module_op_and_the_lead():
    out = text_of(producer_panel(overflow(), 100), 100)
    assert "module down (Linear, call 0)" in out and "op     aten.addmm.default" in out
    assert "code   return F.linear(input, self.weight, self.bias)" in out
    assert "▶ down" in out and out.index("up     Linear") < out.index("▶ down")
    assert producer_panel(clean(), 100) is None


def test_diagnosis_panel_and_replay():
    out = text_of(diagnosis_panel(overflow(), 100), 100)
    assert out.splitlines()[0].startswith("╭─ diagnosis · overflow ")
    assert "check ✔ verified on a copy of the whole model" in out
    rows = text_of(replay_table(overflow()), 100).splitlines()
    fp16 = next(r for r in rows if r.split("│")[0].strip() == "fp16")
    assert [c.strip() for c in fp16.split("│")][1:3] == ["NO", "0"]
    assert diagnosis_panel(clean(), 100) is None and replay_table(clean()) is None


def test_findings_list_near_misses_and_notes():
    rep = clean()
    rep.notes = ["one thing", "another " * 30]
    lines = text_of(findings(rep, 60), 60).splitlines()
    assert lines[0].rstrip() == "note one thing" and all(cell_len(line) <= 60 for line in lines)
    assert lines[1].startswith("note another") and lines[2].startswith(
        "     another"
    )  # wrapped under the value
    assert findings(clean(), 60) is None


@pytest.mark.parametrize("width", [20, 40, 79, 200])
def test_verdict_is_one_line(width):
    line = verdict(overflow(), width)
    assert line.no_wrap and cell_len(line.plain) <= min(79, max(20, width - 1))


def test_bisect_view():
    assert text_of(bisect_view(bisect(), 100), 100) == "keep down → fp32\n"
    assert bisect_view(overflow(), 100) is None


@pytest.mark.parametrize("s", ["[bold]x[/]", "\x1b[2Jwiped", ":smile:"])
def test_untrusted_text_is_never_markup_or_escapes(s):
    out = text_of(t(s), 100)
    assert "\x1b" not in out and ("[bold]x[/]" in out or "\\x1b[2Jwiped" in out or ":smile:" in out)
