"""render/terminal/check_view.py: the rule results table (icon, rule, message wrapped on words)
and the one-line verdict of a check run, naming the failing rules as far as the console allows."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from nan_hunter.render.terminal.check_view import check_verdict, results_table

from ..reports import check
from .console import text_of


def test_results_table_rows():
    lines = text_of(results_table(check(False), 100), 100).splitlines()
    assert lines[0].strip() == "check"
    rows = [line for line in lines if line[:1] in "✔!✘"]
    assert [r.split()[:2] for r in rows] == [
        ["✘", "weights.nonfinite"],
        ["!", "weights.headroom.fp16"],
        ["✔", "weights.headroom.bf16"],
    ]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_results_table_wraps_messages_within_the_width(width):
    lines = text_of(results_table(check(False), width), width).splitlines()
    assert all(cell_len(line) <= width for line in lines)
    assert "(1 NaN, 0 +inf, 0 −inf, first at [1, 2])" in " ".join(" ".join(lines).split())


@pytest.mark.parametrize(
    "reps, text",
    [
        ([check(True)], "✔ check passed"),
        ([check(True, "a"), check(False, "b")], "✘ check failed: b: weights.nonfinite"),
    ],
)
def test_verdict(reps, text):
    line = check_verdict(reps, 100)
    assert line.plain.startswith(text) and line.no_wrap and line.overflow == "ellipsis"


@pytest.mark.parametrize("width", [20, 40, 80])
def test_verdict_is_one_line_of_the_console(width):
    reps = [check(False, f"checkpoint-{i}.safetensors") for i in range(5)]
    assert cell_len(check_verdict(reps, width).plain) <= max(20, width - 1)
