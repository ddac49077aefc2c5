"""render/plot.py: the report's PNG — output absmax per module call against the fp16/fp8 limits
(the producer marked), or weights absmax per tensor for a weights-only report; None when there is
nothing to plot, and one sentence when matplotlib is missing."""

from __future__ import annotations

import io
import sys

import pytest
from PIL import Image

from nan_hunter.render.plot import (
    MISSING,
    PlotUnavailable,
    modules_figure,
    plot_or_note,
    plot_png,
    weights_figure,
)
from nan_hunter.report import Report

from .reports import nan_weights, overflow


def _texts(fig) -> list[str]:
    ax = fig.axes[0]
    return [
        ax.get_title(),
        ax.get_xlabel(),
        *(t.get_text() for t in ax.texts),
        *(t.get_text() for t in ax.get_xticklabels()),
    ]


def test_modules_plot_marks_the_producer():
    texts = _texts(modules_figure(overflow()))
    assert "output absmax per module call, execution order (3 calls, run in fp16)" in texts
    assert "first non-finite: down (Linear)\naten.addmm.default → posinf" in texts
    assert ["up", "down", "<root>"] == [t for t in texts if t in ("up", "down", "<root>")]


def test_weights_plot_marks_the_first_bad_tensor():
    texts = _texts(weights_figure(nan_weights()))
    assert any(t.startswith("weights absmax per tensor, checkpoint order (4 floating tensors") for t in texts)
    assert "first non-finite tensor: up.weight" in texts


@pytest.mark.parametrize("make", [overflow, nan_weights])
def test_png_bytes(make):
    png = plot_png(make())
    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG" and img.width > 200 and img.height > 100
    assert plot_or_note(make()) == (png, None)


def test_nothing_to_plot():
    assert plot_png(Report()) is None
    assert plot_or_note(Report(weights={"tensors": [{"name": "i", "skipped": "not floating point"}]})) == (
        None,
        "nothing to plot: no module outputs and no floating-point weights",
    )


def test_missing_matplotlib(monkeypatch):
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailable, match="matplotlib is not installed"):
        plot_png(overflow())
    assert plot_or_note(overflow()) == (None, MISSING)
