"""render/html.py: the ``--report`` page — self-contained (inline CSS and PNG, no script, no
network), the verdict first, the diagnosis with its replay table (the failing dtype row marked),
the plot or why there is none, the weights, and a source link editors open."""

from __future__ import annotations

import base64
import re

import pytest

from nan_hunter.render.html import render_html
from nan_hunter.render.plot import MISSING
from nan_hunter.version import __version__

from .reports import bisect, check, clean, nan_weights, overflow

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8


def _external(html: str) -> list[str]:
    return [
        u for u in re.findall(r'(?:src|href)="([^"]*)"', html) if not u.startswith(("data:", "file://", "#"))
    ]


@pytest.mark.parametrize("make", [overflow, clean, nan_weights, bisect, lambda: check(False)])
def test_every_page_is_self_contained(make):
    html = render_html([make()], [(None, None)])
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html and _external(html) == []
    assert f"nanhunter {__version__} · report schema nanhunter.report/v1" in html


def test_the_overflow_page():
    html = render_html([overflow()], [(PNG, None)])
    assert (
        '<div class="verdict bad">✘ overflow: +inf first produced by down at aten.addmm (fp16)</div>' in html
    )
    assert "matmul overflow in fp16 at aten.addmm.default in down" in html
    assert re.search(r'<tr class="hit"><td>fp16</td><td>NO</td>', html)  # the failing replay row
    (img,) = re.findall(
        r'<img class="plot" alt="output absmax per module call" src="data:image/png;base64,([^"]+)"', html
    )
    assert base64.b64decode(img) == PNG
    assert 'href="file:///venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"' in html


def test_clean_run_shows_its_modules_strip_not_a_diagnosis():
    html = render_html([clean()], [(None, "nothing to plot")])
    assert "<h2>Modules</h2>" in html and "Diagnosis" not in html
    assert "<h2>Plot</h2>" not in html  # nothing to plot and nothing to install: no empty card


def test_missing_matplotlib_is_said_where_the_plot_goes():
    html = render_html([overflow()], [(None, MISSING)])
    assert '<h2>Plot</h2><p class="note">plot omitted: matplotlib is not installed' in html


def test_several_checkpoints_get_one_verdict_and_a_section_each():
    html = render_html([check(True, "a.safetensors"), check(False, "b.safetensors")], [(None, None)] * 2)
    assert html.count("<h2>Check results</h2>") == 2
    assert "<h2>a.safetensors</h2>" in html and "<hr class=sep><h2>b.safetensors</h2>" in html
    assert html.index("check failed") < html.index("<h2>a.safetensors</h2>")


def test_weights_without_findings_say_so():
    rep = clean()
    rep.weights = {"n_tensors": 7, "nonfinite": []}
    assert '<p class="note">7 tensors: none non-finite, none near a dtype limit.</p>' in render_html(
        [rep], [(None, None)]
    )


def _with_alternatives():
    from nan_hunter.report import FixVerified

    rep = overflow()
    rep.diagnosis.alternatives = [
        {"fix": "run in <bf16> & co", "fix_verified": FixVerified("run in bf16", False, 0.46, "model")},
        {"fix": "keep down in fp32", "fix_verified": None},
        {
            "fix": "SDPA",
            "fix_verified": {"change": "sdpa", "finite": True, "max_rel_err": 0.0, "scope": "region"},
        },
    ]
    return rep


def test_alternatives_are_listed_escaped_outside_the_fix_with_their_own_check():
    """Contract v1.4 ``alternatives``: shown in the HTML view as in the terminal's, each with its own
    verification, never inside the verified fix's box."""
    html = render_html([_with_alternatives()], [(None, None)])
    alts = html[html.index('<div class="alts">') :]
    alts = alts[: alts.index("</div>")]
    assert "run in &lt;bf16&gt; &amp; co" in alts and "<bf16>" not in html
    assert '<li class="bad">' in alts and "past the tolerance" in alts
    assert '<li class="none">keep down in fp32 (not verified)</li>' in alts
    assert "SDPA (checked on the failing module only)" in alts
    fix_box = html[html.index('<div class="fix">') : html.index('<div class="alts">')]
    assert "&lt;bf16&gt;" not in fix_box and "not verified" not in fix_box  # the fix's box holds the fix only
    assert '<div class="alts">' not in render_html([overflow()], [(None, None)])  # none: no section
