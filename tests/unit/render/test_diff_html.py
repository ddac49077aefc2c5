"""render/diff_html.py: ``nanhunter diff --report PATH.html`` — one self-contained page (no
script, no network), the verdict, an SVG of absmax along A's entries with the divergence marked,
the environment keys that differ; every trace string escaped."""

from __future__ import annotations

import re

import pytest

from nan_hunter.divergence.compare import plot_series
from nan_hunter.render.diff_html import MAX_POINTS, page

from .diffs import ENV, agreeing, diverging

HOSTILE = "<script>alert(1)</script>"


def _page(res) -> str:
    return page(res.to_dict(), plot_series(res))


def test_the_page_of_a_divergence(tmp_path):
    html = _page(diverging(tmp_path, env_b={**ENV, "threads": 1}))
    assert html.startswith("<!doctype html>") and html.endswith("</main></body></html>")
    assert '<div class="verdict bad">✘ runs part at mid (M) · aten.exp.default</div>' in html
    assert "<h2>First divergence</h2>" in html and '<dd class="mono">aten.exp.default</dd>' in html
    assert "<td class=mono>threads</td><td class=mono>2</td><td class=mono>1</td>" in html
    assert re.search(r"<svg[^>]*>", html)


def test_agreeing_runs_are_a_good_verdict_without_divergence_card(tmp_path):
    html = _page(agreeing(tmp_path))
    assert '<div class="verdict ok">✔ no divergence' in html
    assert "First divergence" not in html and "Environment keys that differ" not in html


def test_self_contained_and_escaped(tmp_path):
    html = _page(diverging(tmp_path, module=HOSTILE))
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")


def _polylines(html: str) -> list[list[tuple[float, float]]]:
    return [
        [tuple(map(float, p.split(","))) for p in pts.split()]
        for pts in re.findall(r'<polyline [^>]*points="([^"]*)"', html)
    ]


@pytest.mark.parametrize("n", [10, MAX_POINTS, MAX_POINTS * 3 + 1])
def test_long_series_are_drawn_as_their_largest_per_bucket(tmp_path, n):
    res = diverging(tmp_path).to_dict()
    values = [float(i % 7 + 1) for i in range(n)]
    values[n // 2] = 1e6  # a spike survives bucketing: the top of the plot is drawn
    a, b = _polylines(page(res, {"a": values, "b": [None] * n, "bad_a": [], "bad_b": [], "mark": None}))
    assert len(a) == min(n, MAX_POINTS) if n <= MAX_POINTS else len(a) <= MAX_POINTS
    assert min(y for _, y in a) == 20.0  # PAD_T: the largest value sits on the top line
    assert [x for x, _ in a] == sorted(x for x, _ in a) and b == []  # nothing of B to draw


def test_no_finite_value_is_said_not_drawn(tmp_path):
    html = page(
        diverging(tmp_path).to_dict(),
        {"a": [None, 0.0], "b": [None, None], "bad_a": [0], "bad_b": [], "mark": 0},
    )
    assert '<p class="note">no finite absmax to plot</p>' in html and "<svg" not in html


def test_divergence_and_non_finite_entries_are_marked(tmp_path):
    html = page(
        diverging(tmp_path).to_dict(),
        {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.5, None], "bad_a": [2], "bad_b": [1], "mark": 1},
    )
    assert html.count("<circle ") == 2 and "first divergence</text>" in html


def test_details_keep_their_line_breaks(tmp_path):
    """Issue 48: the details showed a literal backslash-n between lines."""
    html = _page(diverging(tmp_path, env_b={**ENV, "threads": 1}))
    pre = re.search(r'<pre class="mono cmd">(.*?)</pre>', html, re.S).group(1)
    assert "\\n" not in pre and pre.count("\n") > 5 and "first divergence  mid (M)" in pre
    assert '<p class="outputs">outputs differ: rel_err 2.00e-01 &gt; 1.0e-03</p>' in html
