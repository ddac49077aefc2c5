"""cli/diff_cmd.py: ``nanhunter diff`` as its function — the comparison's exit code, the JSON
(``nanhunter.diff/v1``), the HTML page (only ``.html``), the view on stdout (stderr when the JSON
takes stdout), the traces themselves never an output."""

from __future__ import annotations

import json

import pytest

from nan_hunter.cli import diff_cmd
from nan_hunter.errors import BadInput

from ..divergence.synthetic import entry, write


@pytest.fixture
def traces(tmp_path):
    a = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", absmax=2.0, producers=[0]),
    ]
    b = [
        entry("m", "aten.mm.default", producers=[None]),
        entry("m", "aten.exp.default", absmax=2.5, producers=[0]),
    ]
    return str(write(tmp_path / "a.jsonl", a)), str(write(tmp_path / "b.jsonl", b))


def test_a_divergence_exits_1_with_json_and_page(traces, tmp_path, capsys):
    a, b = traces
    assert diff_cmd.command(a, b, json=str(tmp_path / "d.json"), report=str(tmp_path / "d.html")) == 1
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["schema"] == "nanhunter.diff/v1" and d["first_divergence"]["op"] == "aten.exp.default"
    assert (tmp_path / "d.html").read_text().startswith("<!doctype html>")
    assert capsys.readouterr().out.startswith("✘ runs part at m (M) · aten.exp.default")


def test_the_same_trace_exits_0(traces, capsys):
    assert diff_cmd.command(traces[0], traces[0], quiet=True) == 0
    assert capsys.readouterr() == ("", "")


def test_json_to_stdout(traces, capsys):
    diff_cmd.command(*traces, json="-")
    out, err = capsys.readouterr()
    assert json.loads(out)["exit_code"] == 1 and err.startswith("✘ runs part at")


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"report": "d.pdf"}, "diff writes HTML"),
        ({"json": "A"}, "is an input"),
    ],
)
def test_refusals(traces, kw, says):
    kw = {k: (traces[0] if v == "A" else v) for k, v in kw.items()}
    with pytest.raises(BadInput, match=says):
        diff_cmd.command(*traces, **kw)


def test_rtol_is_passed_on(traces):
    assert diff_cmd.command(*traces, rtol=0.5, quiet=True) == 0  # 2.0 against 2.5: within 50%
