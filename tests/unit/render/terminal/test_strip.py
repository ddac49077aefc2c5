"""render/terminal/strip.py: the headroom strip as terminal lines — a bar climbing towards the
run's max (full and red for a non-finite output, dots for an empty one), the producer marked,
names shortened in the middle, every line within the width, and columns dropped before numbers
are cut."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from nan_hunter.render.terminal.strip import BAR_MAX, headroom_strip
from nan_hunter.report import Report, RunInfo

from ..reports import clean, overflow
from .console import text_of

LONG = "model.layers.11.feed_forward_network.output_projection_layer"


def _lines(rep: Report, width: int) -> list[str]:
    return text_of(headroom_strip(rep, width), width).splitlines()


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_lines_fit_and_numbers_stay_whole(width):
    lines = _lines(overflow(), width)
    assert all(cell_len(line) <= width for line in lines)
    down = next(line for line in lines if line.startswith("▶"))
    assert down.split()[1] == "down" and "+inf" in down.split()


def test_the_bars():
    lines = _lines(overflow(), 100)
    up = next(line for line in lines if line.split()[:1] == ["up"])
    down = next(line for line in lines if line.startswith("▶"))
    assert "█" * BAR_MAX in down  # non-finite: the whole bar
    assert 0 < up.count("█") < BAR_MAX and "·" in up  # 4 of 65504 on a log scale from 1e-4


def test_an_empty_output_is_all_dots():
    rep = Report(
        run=RunInfo("fp16", "cpu", 1),
        modules=[
            {
                "module": "zero",
                "module_type": "Linear",
                "call_index": 0,
                "input_index": 0,
                "depth": 1,
                "absmax": 0.0,
                "in_absmax": 1.0,
                "nan": 0,
                "posinf": 0,
                "neginf": 0,
            }
        ],
    )
    (row,) = [line for line in _lines(rep, 100) if line.split()[:1] == ["zero"]]
    assert "█" not in row and "·" * 10 in row and row.split()[-1] == "∞"


@pytest.mark.parametrize(
    "width, shown",
    [
        (100, "model.layers.11.…output_projection_layer"),  # whole components go from the middle
        (60, "…utput_projection_layer"),  # the module column at its narrowest: the tail stays
    ],
)
def test_long_names_are_shortened_in_the_middle(width, shown):
    rep = overflow()
    rep.modules[1]["module"] = LONG
    rep.first_nonfinite.module = LONG
    lines = _lines(rep, width)
    row = next(line for line in lines if line.startswith("▶"))
    assert row.split()[1] == shown


def test_no_flush_column_unless_something_flushes():
    assert "→0" not in "\n".join(_lines(clean(), 120))
    rep = clean()
    rep.modules[0]["flush_frac"] = {"fp16": 0.25}
    assert "→0 fp16" in "\n".join(_lines(rep, 120))


def test_no_modules_no_strip():
    assert headroom_strip(Report(), 80) is None
