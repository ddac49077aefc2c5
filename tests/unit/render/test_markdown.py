"""render/markdown.py: the Markdown report — the HTML report's content from the same rows, the
plot as a relative PNG link, tables GitHub renders, and every name set as code."""

from __future__ import annotations

import pytest

from nan_hunter.render.markdown import render_markdown
from nan_hunter.render.plot import MISSING

from .reports import bisect, check, clean, nan_weights, overflow


def _section(md: str, heading: str) -> list[str]:
    lines = md.splitlines()
    at = lines.index(heading)
    end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[at + 1 : end]


def test_the_overflow_report():
    md = render_markdown([overflow()], [("r.png", None)])
    assert md.startswith("# nanhunter scan — model.safetensors\n")
    assert "> **✘ overflow: +inf first produced by down at aten.addmm (fp16)**" in md
    replay = [r for r in _section(md, "### Replay of the failing region (vs float64)") if r.startswith("|")]
    assert replay[0].startswith("| dtype | finite |") and replay[1].startswith("|---|")
    assert any(r.startswith("| fp16 | NO |") for r in replay)
    assert _section(md, "### Plot") == ["", "![output absmax per module call](r.png)", ""]
    assert md.endswith("\n") and not md.endswith("\n\n")


def test_png_names_are_url_quoted():
    md = render_markdown([overflow()], [("my report (1).png", None)])
    assert "![output absmax per module call](my%20report%20%281%29.png)" in md


@pytest.mark.parametrize(
    "why, plot_section",
    [
        (
            MISSING,
            [
                "",
                "_plot omitted: matplotlib is not installed (pip install -e '.\\[plot\\]' in the nanhunter "
                "clone)_",
                "",
            ],
        ),
        ("nothing to plot: no module outputs and no floating-point weights", None),
    ],
)
def test_no_plot(why, plot_section):
    md = render_markdown([clean()], [(None, why)])
    if plot_section is None:
        assert "### Plot" not in md
    else:
        assert _section(md, "### Plot") == plot_section


def test_weights_rows_and_their_absence():
    md = render_markdown([nan_weights()], [(None, None)])
    rows = [r for r in _section(md, "### Weights") if r.startswith("| <code>up.weight</code>")]
    assert len(rows) == 1
    bare = clean()
    bare.weights = {"n_tensors": 2, "nonfinite": []}
    assert "2 tensors: none non-finite, none near a dtype limit." in render_markdown([bare], [(None, None)])


def test_check_reports_one_section_each_with_results():
    md = render_markdown([check(True, "a.safetensors"), check(False, "b.safetensors")], [(None, None)] * 2)
    assert md.splitlines()[2].startswith("> **✘ check failed")
    assert "## <code>a.safetensors</code>" in md and "## <code>b.safetensors</code>" in md
    assert md.count("### Check results") == 2
    assert "| ❌ fail | <code>weights.nonfinite</code> |" in md and "| ⚠️ warn |" in md


def test_bisect_verdict():
    assert (
        "> **✔ keep 1 module(s) in fp32: the fp16 run is finite, max rel err 0 (4 runs)**"
        in render_markdown([bisect()], [(None, None)])
    )


def test_alternatives_are_listed_escaped_with_their_own_check():
    """Contract v1.4 ``alternatives`` in the Markdown view, each with its own verification, after the fix."""
    from .test_html import _with_alternatives

    md = render_markdown([_with_alternatives()], [(None, None)])
    lines = md.splitlines()
    at = lines.index("Other proposals (each with its own check):")
    assert any(ln.startswith("**Fix**:") for ln in lines[:at])
    alts = [ln for ln in lines[at + 1 : at + 6] if ln.startswith("- ")]
    assert len(alts) == 3 and "<bf16>" not in md and "past the tolerance" in alts[0]
    assert alts[1] == "- keep down in fp32 (not verified)"
    assert "Other proposals" not in render_markdown([overflow()], [(None, None)])
