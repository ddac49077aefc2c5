"""render/report_file.py: ``--report PATH`` — HTML by default, Markdown (with its PNG beside it,
written first) for ``.md``/``.markdown``; a missing matplotlib costs the plot and one note."""

from __future__ import annotations

import sys

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.render.report_file import render_report, write_report

from .reports import check, overflow


@pytest.mark.parametrize("suffix", [".html", ".htm", ".HTML"])
def test_html_is_one_file(tmp_path, suffix):
    files, notes = render_report(overflow(), str(tmp_path / f"r{suffix}"))
    assert [p for p, _ in files] == [str(tmp_path / f"r{suffix}")] and notes == []
    assert files[0][1].startswith(b"<!DOCTYPE html>")


def test_markdown_with_one_png_per_report(tmp_path):
    path = str(tmp_path / "r.md")
    files, _ = render_report([check(True, "a"), check(False, "b")], path)
    assert [p for p, _ in files] == [path, str(tmp_path / "r-1.png"), str(tmp_path / "r-2.png")]
    text = files[0][1].decode()
    assert "![weights absmax per tensor](r-1.png)" in text and "(r-2.png)" in text
    assert all(data[:8] == b"\x89PNG\r\n\x1a\n" for _, data in files[1:])


def test_write_report_writes_what_render_report_gives(tmp_path):
    path = str(tmp_path / "r.md")
    files, _ = render_report(overflow(), path)
    assert write_report(overflow(), path) == []
    for p, data in files:
        with open(p, "rb") as f:
            assert f.read() == data


def test_unknown_suffix_is_refused_before_writing(tmp_path):
    with pytest.raises(BadInput, match="--report"):
        write_report(overflow(), str(tmp_path / "r.pdf"))
    assert list(tmp_path.iterdir()) == []


def test_missing_matplotlib_is_one_note_per_command(tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib... raises ImportError
    files, notes = render_report([overflow(), overflow()], str(tmp_path / "r.md"))
    assert len(files) == 1 and notes == [
        "plot omitted: matplotlib is not installed (pip install -e '.[plot]' in the nanhunter clone)"
    ]
    assert "_plot omitted: matplotlib is not installed" in files[0][1].decode()
