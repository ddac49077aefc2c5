"""Every renderer, given a report whose every string is a hostile name (the shared table), emits
no raw control character and no markup of its own making from it."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET

import pytest
from markdown_it import MarkdownIt
from rich.console import Console

from nan_hunter.render import escape
from nan_hunter.render.ci import annotations, render_junit
from nan_hunter.render.html import render_html
from nan_hunter.render.markdown import render_markdown
from nan_hunter.render.terminal import render, render_check

from .hostile_names import acting, hostile, hostile_report

SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour codes rich itself writes


def _terminal(draw, width: int) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=True, color_system="truecolor")
    draw(con)
    return buf.getvalue()


@hostile
@pytest.mark.parametrize("width", [80, 200])
def test_terminal_scan_and_check(name, width):
    for out in (
        _terminal(lambda c: render(hostile_report(name), c, strip=True), width),
        _terminal(lambda c: render_check([hostile_report(name, check=True)], c), width),
    ):
        assert not acting(SGR.sub("", out), allowed="\n")
        assert "\x1b]" not in out and "\x1b[2J" not in out


def test_terminal_shows_markup_literally():
    out = _terminal(lambda c: render(hostile_report("[bold]x[/bold]"), c), 200)
    assert "[bold]x[/bold]" in SGR.sub("", out)
    assert "\\x1b[2J" in SGR.sub("", _terminal(lambda c: render(hostile_report("\x1b[2J"), c), 200))


@hostile
def test_junit(name):
    xml = render_junit([hostile_report(name, check=True)])
    assert not acting(xml, allowed="\n")
    root = ET.fromstring(xml.encode("utf-8"))  # well-formed XML 1.0
    case = root.find("testsuite/testcase")
    assert case.get("name") == escape.junit(f"weights.{name}")
    assert case.find("failure").get("message") == escape.junit(f"bad {name}")


@hostile
def test_annotations(name):
    lines = annotations([hostile_report(name, check=True)])
    assert [line.split(" ", 1)[0] for line in lines] == ["::error", "::warning"]
    for line in lines:
        assert not acting(line)
        head, _, message = line.partition("::")[2].partition("::")
        props = head.split(" ", 1)[1].split(",")
        assert [p.split("=", 1)[0] for p in props] == ["file", "title"]  # no property injected
        assert message == escape.actions_message(message_of(line, name))


def message_of(line: str, name: str) -> str:
    return f"bad {name}" if line.startswith("::error") else f"max at {name}"


@hostile
@pytest.mark.parametrize("check", [False, True])
def test_html(name, check):
    page = render_html([hostile_report(name, check)], [(None, f"no plot {name}")])
    assert not acting(page, allowed="\n")
    assert (
        "<script" not in page and "<img" not in page and "onerror=" not in page.replace("onerror=alert", "")
    )
    assert escape.html(name) in page


@hostile
@pytest.mark.parametrize("check", [False, True])
def test_markdown(name, check):
    md = render_markdown([hostile_report(name, check)], [(None, f"no plot {name}")])
    assert not acting(md, allowed="\n")
    assert "<script" not in md and "<img" not in md
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md)
    tags = set(re.findall(r"<([a-z0-9]+)", html))
    assert tags <= {
        "h1",
        "h2",
        "h3",
        "p",
        "ul",
        "li",
        "blockquote",
        "strong",
        "em",
        "code",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
    }
    assert "<a " not in html and "<del" not in html and "<s>" not in html


def test_markdown_png_link_is_url_quoted():
    md = render_markdown([hostile_report("x")], [("my report) [x].png", None)])
    assert "](my%20report%29%20%5Bx%5D.png)" in md


@hostile
def test_plot(name):
    pytest.importorskip("matplotlib")
    from nan_hunter.render.plot import modules_figure, weights_figure

    rep = hostile_report(name)
    rep.weights["tensors"] = [{"name": name, "absmax": 2.0, "nan": 1}, {"name": "b", "absmax": 1.0}]
    for fig in (modules_figure(rep), weights_figure(rep)):
        for t in fig.findobj(lambda a: hasattr(a, "get_text")):
            label = t.get_text()
            assert not acting(label, allowed="\n")
            assert label.count("$") == label.count("\\$")  # no mathtext from a name
        fig.set_dpi(20)  # small and fast: drawing is what would raise on broken mathtext
        fig.canvas.draw()


def test_plot_png_of_a_hostile_report():
    pytest.importorskip("matplotlib")
    from nan_hunter.render.plot import plot_png

    assert plot_png(hostile_report("\x1b[2J $x_$ <script>"))[:8] == b"\x89PNG\r\n\x1a\n"


@hostile
def test_progress_bar(name):
    from nan_hunter.render.progress import ScanProgress

    p = ScanProgress(delay=0)
    try:
        p.update(name, 10, 100)
        out = _terminal(lambda c: c.print(p.bar.make_tasks_table(p.bar.tasks)), 200)
    finally:
        p.close()
    assert not acting(SGR.sub("", out), allowed="\n")
    assert escape.terminal(name)[-20:] in SGR.sub("", out)  # the name's tail, shown literally
