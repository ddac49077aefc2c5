"""``--report`` files (HTML, Markdown + PNG) and the terminal headroom strip, on a tiny model
whose second Linear overflows fp16; plus a headless-Chromium screenshot of the HTML report. The
command runs in this process (``invoke``; matplotlib made unimportable for one run)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from clirun import invoke
from PIL import Image
from rich.console import Console
from safetensors.torch import save_file

from nan_hunter.render.terminal.strip import headroom_strip
from nan_hunter.report import FirstNonfinite, Report

IMG = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="session")
def model(overflow_model) -> dict[str, str]:
    return overflow_model


def scan_args(model: dict[str, str], *extra: object) -> list:
    return [
        "scan",
        model["ck"],
        "--arch",
        model["arch"],
        "--inputs",
        model["inputs"],
        "--dtype",
        "fp16",
        *extra,
    ]


@pytest.fixture(scope="session")
def scan():
    """``nanhunter scan`` of the overflow model in fp16, with ``extra`` flags (in this process)."""

    def run(model: dict[str, str], *extra: object, env: dict | None = None):
        return invoke(*scan_args(model, *extra), env=env)

    return run


def png_ok(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = Image.open(io.BytesIO(data))
    img.load()
    assert img.width > 200 and img.height > 100
    return img.size


@pytest.fixture(scope="module")
def html_report(model, tmp_path_factory, scan) -> Path:
    path = tmp_path_factory.mktemp("html") / "report.html"
    res = scan(model, "--report", path, "-q")
    assert res.code == 1, res.stderr
    return path


def test_html_is_self_contained_with_plot_and_producer(html_report):
    page = html_report.read_text()
    m = IMG.search(page)
    assert m, "no embedded PNG"
    png_ok(base64.b64decode(m.group(1)))
    assert "<code>down</code>" in page and "aten.addmm.default" in page  # diagnosis: where
    assert "overflow" in page and "Replay of the failing region" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_markdown_report_writes_png_next_to_it(model, tmp_path, scan):
    res = scan(model, "--report", tmp_path / "r.md", "-q")
    assert res.code == 1, res.stderr
    md = (tmp_path / "r.md").read_text()
    assert "](r.png)" in md and "<code>down</code>" in md and "| fp16 | NO |" in md
    png_ok((tmp_path / "r.png").read_bytes())


def test_check_report_has_results_and_dtype_matrix(model, tmp_path):
    res = invoke(
        "check",
        model["ck"],
        "--arch",
        model["arch"],
        "--inputs",
        model["inputs"],
        "--report",
        tmp_path / "c.html",
        "-q",
    )
    assert res.code == 1, res.stderr
    page = (tmp_path / "c.html").read_text()
    assert "Check results" in page and "forward.fp16.nonfinite" in page and "Forward per dtype" in page
    png_ok(base64.b64decode(IMG.search(page).group(1)))


def test_weights_only_report_plots_tensors(tmp_path):
    w = torch.full((4, 4), 0.5)
    w[0, 0] = float("inf")
    save_file({"a.weight": w, "a.bias": torch.ones(4)}, str(tmp_path / "w.safetensors"))
    res = invoke("scan", tmp_path / "w.safetensors", "--report", tmp_path / "w.html", "-q")
    assert res.code == 1
    page = (tmp_path / "w.html").read_text()
    assert 'alt="weights absmax per tensor"' in page and "a.weight" in page
    png_ok(base64.b64decode(IMG.search(page).group(1)))


def test_missing_matplotlib_costs_the_plot_and_one_line(model, tmp_path):
    res = invoke(*scan_args(model, "--report", tmp_path / "r.html", "-q"), missing=("matplotlib",))
    assert res.code == 1 and res.stderr == ""  # --quiet: the page says it (issue 32, item 6)
    res = invoke(*scan_args(model, "--report", tmp_path / "r.html"), missing=("matplotlib",))
    assert res.code == 1
    assert [ln for ln in res.stderr.splitlines() if "plot omitted" in ln] == [
        "nanhunter: plot omitted: matplotlib is not installed (pip install -e '.[plot]' in the nanhunter clone)"
    ]
    page = (tmp_path / "r.html").read_text()
    assert "matplotlib is not installed" in page and not IMG.search(page)


def test_bad_report_suffix_is_bad_input(model, tmp_path, scan):
    res = scan(model, "--report", tmp_path / "r.pdf")
    assert res.code == 2
    assert res.stderr.startswith("nanhunter: error: --report") and ".html" in res.stderr


def test_strip_on_for_failing_scan_and_off_with_flag(model, scan):
    on = scan(model)
    assert "headroom per module call" in on.stdout and "▶" in on.stdout
    assert "headroom per module call" not in scan(model, "--no-strip").stdout


def test_strip_collapses_long_runs_and_marks_producer():
    rows = [
        {
            "module": f"layers.{i}",
            "module_type": "Linear",
            "call_index": 0,
            "input_index": 0,
            "depth": 1,
            "absmax": float(i + 1),
            "in_absmax": 1.0,
            "nan": 0,
            "posinf": 0,
            "neginf": 0,
        }
        for i in range(100)
    ]
    rows[70].update(absmax=0.0, posinf=3)
    rep = Report(
        run={"dtype": "fp16", "device": "cpu", "n_inputs": 1, "failed_inputs": [0]},
        modules=rows,
        first_nonfinite=FirstNonfinite(0, "layers.70", "Linear", "aten.addmm.default", "posinf", "producer"),
    )
    con = Console(record=True, width=140)
    con.print(headroom_strip(rep, con.width))
    text = con.export_text()
    assert "▶" in text and "layers.70" in text and "⋮" in text
    assert len(text.splitlines()) <= 40 + 6  # title, header, 40 rows, a few collapse lines
    assert "layers.66" in text  # the calls leading to the producer stay visible


@pytest.mark.chromium
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_chromium_renders_the_report(html_report, tmp_path):
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
        html_report.resolve().as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=60)
    assert shot.is_file() and shot.stat().st_size > 0
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 1600)
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 50  # a rendered page, not a blank single colour
