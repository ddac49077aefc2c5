"""Issue 32, item 6: the rendering defects a new user met, each fixed and pinned here — terminal
captures at 80 and 120 columns, the HTML and Markdown reports, and the one-line texts."""

from __future__ import annotations

import dataclasses
import io
import re
import shutil
import subprocess

import pytest
from rich.console import Console

from nan_hunter.render import rows as R
from nan_hunter.render.html import render_html
from nan_hunter.render.markdown import render_markdown
from nan_hunter.render.plot import MISSING
from nan_hunter.render.terminal import render, render_check
from nan_hunter.report import Diagnosis, FirstNonfinite, Report

LONG = "model.layers.11.feed_forward_network.output_projection_layer"
RULES = [
    "forward.fp16.finite",
    "forward.fp16.headroom",
    "weights.fp16.overflow",
    "forward.bf16.finite",
    "forward.fp8-e4m3.finite",
    "weights.fp8-e4m3.overflow",
    "forward.fp8-e5m2.finite",
]


def _console(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, markup=False, emoji=False, highlight=False, color_system=None), buf


def _modules(absmin: bool = True) -> list[dict]:
    mods = []
    for i, (name, amax) in enumerate(
        [("model.embed_tokens", 3.0), ("model.layers.11.self_attn.q_proj", 40.0), (LONG, float("inf"))]
    ):
        m = {
            "module": name,
            "module_type": "Linear",
            "call_index": 0,
            "input_index": 0,
            "depth": name.count("."),
            "absmax": amax,
            "in_absmax": 1.0,
            "nan": 0,
            "posinf": int(amax == float("inf")),
            "neginf": 0,
        }
        if absmin:
            m.update(min_nonzero=1e-3 * (i + 1), subnormal_frac=0.0)
        mods.append(m)
    return mods


def _scan_rep(absmin: bool = True, **kw) -> Report:
    fix = "keep the layer in fp32: `--keep-dtype fp32`, or set `eps=1e-5`"
    d = Diagnosis(
        "overflow",
        "fp16",
        LONG,
        "aten.mm.default",
        "matmul overflow in fp16: the product of two large operands exceeds 65504",
        ["absmax of the operands 300 and 400", "replay: finite in fp32"],
        fix,
    )
    base = dict(
        checkpoint={"path": "m.safetensors", "format": "safetensors", "n_tensors": 3, "bytes": 10},
        weights={"n_tensors": 3, "nonfinite": []},
        run={"dtype": "fp16", "device": "cpu", "n_inputs": 1, "failed_inputs": [0]},
        first_nonfinite=FirstNonfinite(0, LONG, "Linear", "aten.mm.default", "posinf", "producer"),
        diagnosis=d,
        modules=_modules(absmin),
    )
    base.update(kw)
    return Report(**base)


def _check_rep(label: str, rules: list[str]) -> Report:
    res = [
        {
            "rule": r,
            "checkpoint": label,
            "status": "fail",
            "message": f"{r} failed",
            "dtype": "fp16",
            "value": None,
            "details": [],
        }
        for r in rules
    ]
    res.append(
        {
            "rule": "weights.finite",
            "checkpoint": label,
            "status": "pass",
            "message": "ok",
            "dtype": None,
            "value": None,
            "details": [],
        }
    )
    return Report(
        checkpoint={"path": label, "format": "safetensors", "n_tensors": 1, "bytes": 10},
        weights={"n_tensors": 1, "nonfinite": []},
        check={"passed": False, "dtypes": ["fp16"], "results": res, "runs": {}},
    )


@pytest.mark.parametrize("width", [80, 120, 200])
def test_check_verdict_names_the_failing_rules(width):
    """Was "✘ check failed: 1 checkpoint(s), 8 rules: 7 failed, 0 warning(s) (failing: m…" at any
    width: the rules, the line's purpose, were cut off."""
    c, buf = _console(width)
    render_check([_check_rep("checkpoints/model-v2.safetensors", RULES)], c)
    lines = buf.getvalue().splitlines()
    verdict = lines[0]
    assert verdict == lines[-1] and verdict.startswith("✘ check failed: forward.fp16.finite")
    assert all(R.cells(line) <= width for line in lines)
    shown = [r for r in RULES if re.search(rf"(?<![\w.-]){re.escape(r)}(?![\w.-])", verdict)]
    assert shown == RULES[: len(shown)] and len(shown) >= 2  # whole names, in order
    if len(shown) < len(RULES):
        assert f"+{len(RULES) - len(shown)} more" in verdict
    else:  # every name fits; the counts follow where they fit too
        assert "more" not in verdict
    assert len(shown) >= {80: 2, 120: 4, 200: 7}[width]


def test_check_verdict_names_each_checkpoint_with_its_rules():
    v = R.check_verdict(
        [_check_rep("a.safetensors", RULES[:1]), _check_rep("b.safetensors", RULES[1:2])], 120
    )
    assert v.text.startswith(
        "✘ check failed: a.safetensors: forward.fp16.finite; b.safetensors: forward.fp16.headroom"
    )


def test_huge_share_of_max_is_a_factor_not_a_percentage():
    from nan_hunter.pipeline.ci_check import _share

    assert R.share_of_max(6.259247389645181e25) == "6.26e+25x"
    assert R.share_of_max(0.125) == "12.50%" and R.share_of_max(2.1e-6) == "2.1e-06"
    assert "%" not in _share(6.259247389645181e25, "fp16", 65504.0)
    assert _share(6.259247389645181e25, "fp16", 65504.0) == "is 6.26e+25x fp16 max 65504"
    assert _share(0.5, "fp16", 65504.0) == "is 50% of fp16 max 65504"


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_capture(width):
    """The scan view of an overflow at a long module name: every line fits; the strip keeps the
    layer index and the leaf whole (was "…eed_forward_network.output_projection_layer"); the
    diagnosis never reads "overflow matmul overflow"; no user text names a config key."""
    c, buf = _console(width)
    render(_scan_rep(), c, strip=True)
    text = buf.getvalue()
    lines = text.splitlines()
    assert all(R.cells(line) <= width for line in lines), text
    assert "overflow matmul overflow" not in " ".join(" ".join(ln.strip("│ ").split()) for ln in lines)
    assert any("diagnosis · overflow" in ln for ln in lines)
    strip_rows = [ln for ln in lines if "output_projection_layer" in ln]
    assert strip_rows, text
    for ln in strip_rows:
        assert re.search(r"(^|[\s.…])11\.", ln) and "eed_forward" not in ln.replace("feed_forward", ""), ln
    assert "rel_err_warn" not in text and "diagnosis." not in text


def test_inaccurate_replay_says_it_in_words():
    from nan_hunter.config import DiagnosisConfig
    from nan_hunter.explain.diagnose import Evidence, _inaccurate_line

    replay = {
        d: {
            "finite": True,
            "nan": 0,
            "posinf": 0,
            "neginf": 0,
            "absmax": 1.0,
            "rel_err": 0.2 if d == "bf16" else 0.0,
        }
        for d in ("fp32", "bf16", "fp16", "fp64")
    }
    ev = Evidence(
        role="producer",
        kind="posinf",
        module="m",
        module_type="Linear",
        op="aten.mm.default",
        operands=[],
        dtype="fp16",
        replay=replay,
        config=DiagnosisConfig(tiny_scale=1e-4, rel_err_warn=0.05),
    )
    line = _inaccurate_line(ev)
    assert line == "replay: finite but inaccurate in bf16 (rel_err 0.2) — more than 5% off the float64 result"


@pytest.mark.parametrize("width", [80, 120])
def test_no_abs_min_column_of_dashes_when_none_was_measured(width):
    """A --generate run measures no abs-min: the column is left out (was "—" on every row)."""
    c, buf = _console(width)
    rep = _scan_rep(absmin=False)
    render(rep, c, strip=True)
    assert "abs-min" not in buf.getvalue() and "absmax" in buf.getvalue()
    page = render_html([rep], [(None, "no plot")])
    assert "<th class=num>abs-min</th>" not in page and "<th class=num>absmax</th>" in page
    md = render_markdown([rep], [(None, None)])
    assert "abs-min" not in md
    # a measured run keeps it
    c, buf = _console(width)
    render(_scan_rep(), c, strip=True)
    assert "abs-min" in buf.getvalue()
    assert "<th class=num>abs-min</th>" in render_html([_scan_rep()], [(None, None)])


def test_html_sets_code_spans_and_shows_no_empty_plot_card():
    rep = _scan_rep(notes=["replay it with: `nanhunter scan m.safetensors --dtype fp16`"])
    page = render_html([rep], [(None, "nothing to plot")])
    assert "<code>--keep-dtype fp32</code>" in page and "<code>eps=1e-5</code>" in page
    assert "<code>nanhunter scan m.safetensors --dtype fp16</code>" in page
    body = re.sub(r"<style>.*?</style>|<script>.*?</script>", "", page, flags=re.S)
    assert "`" not in body
    assert "<h2>Plot</h2>" not in page  # nothing to draw: no card (was an empty "Plot" card)
    page = render_html([rep], [(None, MISSING)])
    assert "<h2>Plot</h2>" in page and "<code>" in page and "matplotlib is not installed" in page
    md = render_markdown([rep], [(None, "nothing to plot")])
    assert "### Plot" not in md and "<code>eps=1e-5</code>" in md


def test_diagnosis_cause_is_the_heading_not_a_prefix_of_the_summary():
    rep = _scan_rep()
    page = render_html([rep], [(None, None)])
    assert '<h2>Diagnosis <span class="badge cause">overflow</span></h2>' in page
    assert "<p>matmul overflow in fp16" in page
    md = render_markdown([rep], [(None, None)])
    assert "### Diagnosis: <code>overflow</code>" in md and "— matmul" not in md
    assert "\nmatmul overflow in fp16" in md


def test_a_report_without_min_nonzero_is_a_generate_like_strip():
    rep = _scan_rep(absmin=False)
    assert not any("min_nonzero" in m for m in rep.modules)
    rep2 = dataclasses.replace(rep, modules=_modules(True))
    from nan_hunter.render.headroom import strip

    assert strip(rep2).has_absmin and not strip(rep).has_absmin


@pytest.mark.chromium
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_chromium_screenshot_of_the_fixed_page(tmp_path):
    """The page as a browser draws it: the cause badge sits in the Diagnosis heading (purple,
    #6a1b9a), the code spans are drawn as code, and no empty Plot card is left at the end."""
    from PIL import Image

    page = tmp_path / "r.html"
    page.write_text(render_html([_scan_rep()], [(None, "nothing to plot")]), encoding="utf-8")
    shot = tmp_path / "shot.png"
    cmd = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1200,1600",
        page.resolve().as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=60)
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 1600)
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 50  # a drawn page, not a blank one
    purple = [
        (x, y)
        for y in range(0, 1600, 2)
        for x in range(0, 1200, 2)
        if (lambda p: abs(p[0] - 0x6A) < 12 and abs(p[1] - 0x1B) < 12 and abs(p[2] - 0x9A) < 12)(
            img.getpixel((x, y))
        )
    ]
    assert purple, "the cause badge is not drawn"
