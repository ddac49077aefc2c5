"""render/report_view.py: what ``nan_hunter.scan``/``bisect`` return — the report's own fields,
printing as the command does (the strip only for a failing run), writing its HTML and JSON."""

from __future__ import annotations

import json

import pytest

from nan_hunter.render.report_view import PrintableReport, printable
from nan_hunter.render.terminal import check_text, render_text

from .reports import bisect, check, clean, overflow


def test_printable_shares_the_fields():
    rep = overflow()
    p = printable(rep)
    assert isinstance(p, PrintableReport)
    assert (
        p.first_nonfinite is rep.first_nonfinite and p.modules is rep.modules and p.to_dict() == rep.to_dict()
    )


def test_str_is_the_terminal_view_with_the_strip_when_it_fails():
    rep = printable(overflow())
    text = rep.render(100)
    assert text == render_text(rep, 100, strip=True) and "headroom per module call" in text
    assert "headroom per module call" not in printable(clean()).render(100)
    assert printable(bisect()).render(100).splitlines()[-1].startswith("✔ keep 1 module(s) in fp32")


def test_to_html_and_to_json(tmp_path):
    rep = printable(overflow())
    rep.to_html(str(tmp_path / "r.html"))
    rep.to_json(str(tmp_path / "r.json"))
    assert "aten.addmm.default" in (tmp_path / "r.html").read_text()
    assert json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]["module"] == "down"


def test_keys_as_the_json_report_and_a_check_report_prints_its_rules():
    """issue 44: one printable type for scan, bisect, check and watch (``session.watch_report``)."""
    rep = printable(overflow())
    assert rep["schema"] == "nanhunter.report/v1" and rep["first_nonfinite"]["module"] == "down"
    with pytest.raises(KeyError):
        rep["no_such_key"]
    failed = printable(check(False))
    text = failed.render(100)
    assert text == check_text([failed], 100) and text != render_text(failed, 100)
    assert str(printable(check(True))).strip()
