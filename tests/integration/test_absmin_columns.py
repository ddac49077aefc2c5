"""Abs-min beside abs-max per module row (JSON ``modules[i].min_nonzero``, ``subnormal_frac``), in
the terminal strip at 80 and 120 columns, in HTML; captures of a shipped incident at both widths."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from nan_hunter.pipeline.scan_checkpoint import scan
from nan_hunter.render.html import render_html
from nan_hunter.render.rows import cells, verdict
from nan_hunter.render.terminal import render

ROOT = Path(__file__).resolve().parents[2]
INC = "examples/incidents/eps_underflow"  # relative to ROOT, as a user in the checkout types it


@pytest.fixture(scope="module")
def rep():
    """The incident scanned from the repository root with relative paths: the header names the
    checkpoint as given, so an absolute path made the capture depend on where the checkout lives
    (a root longer than 19 characters wraps the path at 80 columns and pushes the verdict to the
    fifth line)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return scan(
            f"{INC}/model.safetensors",
            arch=f"{INC}/model.py:build",
            inputs=[f"{INC}/inputs.safetensors"],
            dtype="fp16",
            device="cpu",
        )


def _capture(rep, width: int) -> str:
    """The terminal view into a file at ``width`` columns, plain text whatever the environment says
    (FORCE_COLOR or TTY_COMPATIBLE would make rich colour a file too)."""
    buf = io.StringIO()
    render(
        rep,
        Console(file=buf, width=width, markup=False, emoji=False, highlight=False, color_system=None),
        strip=True,
    )
    return buf.getvalue()


def test_rows_carry_abs_min(rep):
    norm = next(m for m in rep.modules if m["module"] == "norm")
    assert 0 < norm["min_nonzero"] <= norm["absmax"] and norm["subnormal_frac"] == 0.0
    d = rep.to_dict()
    assert all("min_nonzero" in m and "subnormal_frac" in m for m in d["modules"])


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_capture(rep, width):
    lines = _capture(rep, width).splitlines()
    v = verdict(rep).text
    assert v == "✘ division_by_zero: NaN first produced by norm at aten.div.Tensor (fp16)"
    assert lines[3] == v and lines[-1] == v  # after the 3 header lines, and at the end
    assert all(cells(line) <= width for line in lines)
    strip_head = next(line for line in lines if "abs-min" in line)
    assert "absmax" in strip_head and "headroom" in strip_head
    assert any("0.007282" in line and "norm" in line for line in lines)
    assert sum("replay: finite in fp32" in line for line in lines) == 1  # said once
    assert "✔ verified on a copy of the whole model: an eps fp16 can hold" in " ".join(
        " ".join(line.strip("│ ").split()) for line in lines
    )


def test_html_strip_has_abs_min(rep):
    page = render_html([rep], [(None, "no plot")])
    assert "<th class=num>abs-min</th>" in page and "0.007282" in page


TINY_ARCH = """
from collections import OrderedDict
import torch
from torch import nn

class Scale(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, x):
        return x * self.s

def build():
    return nn.Sequential(OrderedDict(proj=nn.Linear(64, 64), shrink=Scale(1e-7), out=nn.Linear(64, 8)))
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A real fp32 model whose ``shrink`` outputs straddle fp16's flush limit (2^-25 ≈ 3e-8): a
    cast to fp16 would round part of them to zero, bf16 none of them."""
    import torch
    from safetensors.torch import save_file

    tmp = tmp_path_factory.mktemp("tiny")
    (tmp / "model.py").write_text(TINY_ARCH)
    ns: dict = {}
    exec(TINY_ARCH, ns)
    torch.manual_seed(0)
    m = ns["build"]()
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(tmp / "model.safetensors"))
    x = torch.randn(16, 64)
    save_file({"input": x}, str(tmp / "inputs.safetensors"))
    with torch.no_grad():
        shrunk = m.shrink(m.proj(x))
    return {
        "dir": tmp,
        "shrunk": shrunk,
        "args": [
            str(tmp / "model.safetensors"),
            "--arch",
            f"{tmp / 'model.py'}:build",
            "--inputs",
            str(tmp / "inputs.safetensors"),
        ],
    }


def test_flush_share_per_target_dtype_in_json(cli_main, tiny_model):
    import torch

    r = cli_main("scan", *tiny_model["args"], "--dtype", "fp32", "--strip")
    assert r.code == 0, r.stderr
    row = next(m for m in r.report["modules"] if m["module"] == "shrink")
    x = tiny_model["shrunk"]
    for d, td in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        want = int(((x.to(td).float() == 0) & (x != 0)).sum()) / x.numel()
        assert row["flush_frac"][d] == pytest.approx(want, abs=0), d
    assert 0.01 < row["flush_frac"]["fp16"] < 0.9 and row["flush_frac"]["bf16"] == 0.0
    # fp8 flushes are counted by the GPU kernel; the CPU fast path leaves them unmeasured (null)
    # where some value is small enough to flush
    assert row["flush_frac"]["fp8-e4m3"] is None and row["flush_frac"]["fp8-e5m2"] is None
    assert row["min_nonzero"] == pytest.approx(float(x.abs()[x != 0].min()), rel=1e-6)
    proj = next(m for m in r.report["modules"] if m["module"] == "proj")
    assert proj["flush_frac"]["fp16"] == 0.0


@pytest.mark.parametrize("width", [80, 120])
def test_flush_column_in_terminal_and_html(cli_main, tiny_model, tmp_path, width):
    html = tmp_path / "r.html"
    r = cli_main(
        "scan",
        *tiny_model["args"],
        "--dtype",
        "fp32",
        "--strip",
        "--report",
        str(html),
        env={"COLUMNS": str(width)},
    )
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(cells(line) <= width for line in lines)
    share = f"{r.report['modules'][1]['flush_frac']['fp16']:.0%}"
    if width >= 100:  # the optional column is shown where it fits
        head = next(line for line in lines if "abs-min" in line)
        assert head.rstrip().endswith("→0 fp16")
        assert any("shrink" in line and line.rstrip().endswith(share) for line in lines)
    page = html.read_text()
    assert "→0 in fp16</th>" in page and f"<td class=num>{share}</td>" in page


def test_no_flush_column_when_nothing_flushes(rep):
    assert "→0" not in _capture(rep, 120)  # an fp16 run's fp16 outputs: nothing can flush further
    assert all(m["flush_frac"]["fp16"] in (0.0, None) for m in rep.modules)
