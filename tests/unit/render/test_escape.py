"""``render.escape``: each sink's function, run through the one table of hostile names."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt
from rich.console import Console
from rich.text import Text

from nan_hunter.render import escape

from .hostile_names import acting, hostile


def test_visible_names_what_it_escapes():
    assert escape.visible("\x1b[2J\x1b]0;t\x07") == "\\x1b[2J\\x1b]0;t\\x07"
    assert escape.visible("a\nb\tc\r") == "a\\nb\\tc\\r"
    assert escape.visible("\x9b\u202e\udc80\U000e0001") == "\\x9b\\u202e\\udc80\\U000e0001"
    assert escape.visible("model.layers.0 层 🙂 ü") == "model.layers.0 层 🙂 ü"  # printable text untouched


@hostile
def test_terminal(name):
    out = escape.terminal(name)
    assert not acting(out)
    con = Console(
        record=True, width=400, force_terminal=True, color_system="truecolor", markup=True, emoji=True
    )
    con.print(Text(out))
    shown = con.export_text()
    assert shown.rstrip("\n") == out  # printed as is: no markup, emoji code or control sequence acted
    assert not acting(shown, allowed="\n")


@hostile
def test_junit(name):
    out = escape.junit(name)
    assert not acting(out)
    root = ET.Element("testcase", name=out)
    root.text = out
    back = ET.fromstring(ET.tostring(root, encoding="unicode"))
    assert back.get("name") == out and back.text == out


@hostile
def test_actions(name):
    msg, prop = escape.actions_message(name), escape.actions_property(name)
    for out in (msg, prop):
        assert not acting(out) and "\n" not in out and "\r" not in out
    assert ":" not in prop and "," not in prop
    # the runner decodes %0D, %0A and %25 (and %3A, %2C in properties): the text comes back, with
    # every other control character shown as an escape
    decode = {"%0D": "\r", "%0A": "\n", "%3A": ":", "%2C": ","}

    def unescape(s: str) -> str:
        for k, v in decode.items():
            s = s.replace(k, v)
        return s.replace("%25", "%")

    assert unescape(msg) == unescape(prop) == escape.visible(name, keep="\r\n")


def test_actions_encoding_matches_the_toolkit():
    assert escape.actions_message("50%\r\nx") == "50%25%0D%0Ax"
    assert escape.actions_property("a:b,c%") == "a%3Ab%2Cc%25"


@hostile
def test_html(name):
    out = escape.html(name)
    assert not acting(out)
    assert "<" not in out and ">" not in out and '"' not in out
    assert html.unescape(out) == escape.visible(name)


class _Page(HTMLParser):
    """Tags and text of rendered Markdown."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.text = ""

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)

    def handle_data(self, data):
        self.text += data


def _rendered(md: str) -> _Page:
    page = _Page()
    page.feed(MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md))
    return page


@hostile
@pytest.mark.parametrize("where", ["paragraph", "table cell", "code"])
def test_markdown(name, where):
    cell = escape.markdown_code(name) if where == "code" else escape.markdown(name)
    assert not acting(cell)
    assert "<script" not in cell and "<img" not in cell
    md = f"| a | b |\n|---|---|\n| x | {cell} |\n" if where == "table cell" else f"- note: {cell}\n"
    page = _rendered(md)
    # nothing in the name became markup: only the tags the report itself writes, and the text shown
    # is the name (control characters as escapes)
    assert page.tags <= {"ul", "li", "table", "thead", "tbody", "tr", "th", "td", "code"}
    assert escape.visible(name) in page.text


@hostile
def test_plot(name):
    mpl = pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    out = escape.plot(name)
    assert not acting(out)
    fig = Figure()
    t = fig.text(0.1, 0.5, out)
    assert t._preprocess_math(out)[1] is False  # never parsed as mathtext
    fig.canvas.draw()  # a label that parsed as broken mathtext would raise here
    assert mpl is not None
