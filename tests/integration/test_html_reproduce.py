"""HTML that helps reproduce: the source line as a link, the command line, versions, the data
set's inputs with their text, every tensor; and the verified fix. In-process through the CLI;
the screenshot in headless Chromium when it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nan_hunter.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
INC = ROOT / "examples/incidents/ffn_wo_overflow"


@pytest.fixture(scope="module")
def incident_page(tmp_path_factory) -> Path:
    page = tmp_path_factory.mktemp("html") / "r.html"
    assert (
        main(
            [
                "scan",
                str(INC / "model.safetensors"),
                "--arch",
                f"{INC / 'model.py'}:build",
                "--inputs",
                str(INC / "inputs.safetensors"),
                "--dtype",
                "fp16",
                "--report",
                str(page),
                "--quiet",
            ]
        )
        == 1
    )
    return page


def test_incident_page_links_source_and_shows_command_versions_and_fix(incident_page):
    html = incident_page.read_text()
    assert f'<a href="file://{INC / "model.py"}">{INC / "model.py"}:' in html
    assert "<h3>Command</h3>" in html and "--dtype fp16 --report" in html
    for pkg in ("nanhunter", "torch", "transformers"):
        assert f"<dt>{pkg}</dt>" in html
    assert "ffn.wo.weight" in html and "abs-min ≠ 0" in html  # every tensor, with its smallest magnitude
    assert "✔ verified on a copy of the whole model: keep ffn.wo in fp32" in html
    assert html.index("✘ overflow:") < html.index("Diagnosis")  # the verdict before the details


def test_prompt_text_is_in_the_page_escaped(tmp_path):
    page = tmp_path / "p.html"
    code = main(
        [
            "scan",
            str(ROOT / "examples/tiny-llama-fp16"),
            "--prompt",
            "a <b>bold</b> prompt",
            "--prompt",
            "second",
            "--report",
            str(page),
            "--quiet",
        ]
    )
    assert code == 0
    html = page.read_text()
    assert "a &lt;b&gt;bold&lt;/b&gt; prompt" in html and "<b>bold</b>" not in html
    assert "<h3>Inputs</h3>" in html and "prompt 1" in html and "second" in html


@pytest.mark.chromium
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_chromium_screenshot_of_the_verified_fix(incident_page, tmp_path):
    from PIL import Image

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
        "--window-size=1200,2400",
        incident_page.resolve().as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=60)
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 2400)
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 50
    # the red verdict banner is drawn near the top of the page
    top = img.crop((0, 0, 1200, 500)).getcolors(maxcolors=1 << 20) or []
    assert any(r > 150 and g < 80 and b < 80 for _, (r, g, b) in top)
