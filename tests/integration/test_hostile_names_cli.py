"""A real checkpoint whose tensor name holds terminal escapes and a script tag, with a NaN in that
tensor, through the real command: no raw control character and no unescaped markup reaches the
terminal, the Markdown or HTML report, the JUnit XML or the GitHub Actions annotations."""

from __future__ import annotations

import re
import unicodedata
import xml.etree.ElementTree as ET

import pytest
import torch
from safetensors.torch import save_file

NAME = "\x1b[2J\x1b]0;pwned\x07<script>alert(1)</script>"
SHOWN = "\\x1b[2J\\x1b]0;pwned\\x07"  # how the control characters read once escaped


def acting(s: str) -> list[str]:
    """Control and format characters other than the newline ending each line."""
    return [c for c in s if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


@pytest.fixture(scope="module")
def hostile_ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    w = torch.ones(4, 4)
    w[1, 2] = float("nan")
    save_file({NAME: w, "ok.bias": torch.ones(4)}, str(d / "model.safetensors"))
    return d


def test_scan_with_reports(hostile_ck, run_main):
    ck = hostile_ck / "model.safetensors"
    md, html = hostile_ck / "x.md", hostile_ck / "x.html"
    for report in (md, html):
        res = run_main("scan", ck, "--report", report, env={"COLUMNS": "80"})
        assert res.code == 1, res.stderr
        assert not acting(res.stdout) and not acting(res.stderr), (res.stdout, res.stderr)
        assert SHOWN in res.stdout and "<script>alert(1)</script>" in res.stdout  # shown, inert in a terminal
    page = html.read_text(encoding="utf-8")
    text = md.read_text(encoding="utf-8")
    for out in (page, text):
        assert not acting(out)
        assert "<script" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert SHOWN in page
    assert r"\\x1b\[2J\\x1b\]0;pwned\\x07" in text  # Markdown: backslashes and brackets escaped too


def test_check_junit_and_annotations(hostile_ck, run_main):
    ck = hostile_ck / "model.safetensors"
    junit = hostile_ck / "check.xml"
    res = run_main("check", ck, "--junit", junit, env={"GITHUB_ACTIONS": "true", "COLUMNS": "80"})
    assert res.code == 1, res.stderr
    assert not acting(res.stdout) and not acting(res.stderr), (res.stdout, res.stderr)
    xml = junit.read_text(encoding="utf-8")
    assert not acting(xml) and "<script" not in xml
    root = ET.fromstring(xml.encode("utf-8"))  # well-formed: CI keeps the whole report
    failure = root.find(".//testcase[@name='weights.nonfinite']/failure")
    assert SHOWN in failure.get("message") and "<script>alert(1)</script>" in failure.get("message")
    notes = [x for x in res.stdout.splitlines() if x.startswith("::")]
    assert notes and all(re.fullmatch(r"::(error|warning) file=[^,:]+,title=[^,:]+::.+", x) for x in notes), (
        notes
    )
    assert any(SHOWN in x for x in notes)
