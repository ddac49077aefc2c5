"""render/terminal/__init__.py: the whole terminal view of a report (header, the verdict up front
when panels follow, weights, strip, producer and diagnosis panels, findings, the verdict last),
of a check run, and as plain text; a console whose reader left ends quietly."""

from __future__ import annotations

import io
import sys

import pytest
from rich.cells import cell_len
from rich.console import Console

from nan_hunter.render.terminal import ReportConsole, console, render, render_check, render_text

from ..reports import bisect, check, clean, nan_weights, overflow

VERDICT = "✘ overflow: +inf first produced by down at aten.addmm (fp16)"


def _plain(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, color_system=None, markup=False, emoji=False, highlight=False), buf


@pytest.mark.parametrize("width", [80, 100, 160])
def test_every_line_fits_and_the_verdict_opens_and_closes(width):
    lines = render_text(overflow(), width, strip=True).splitlines()
    assert all(cell_len(line) <= width for line in lines)
    assert lines[3] == VERDICT and lines[-1] == VERDICT
    assert any(line.startswith("headroom per module call") for line in lines)


def test_the_strip_only_when_asked():
    assert "headroom per module call" not in render_text(overflow(), 100)


def test_a_clean_run_states_the_verdict_once_more_only_after_panels():
    lines = render_text(clean(), 100).splitlines()
    assert lines[3] == "✔ no NaN/Inf found" and lines[-1] == "✔ no NaN/Inf found"  # weights rows come between
    bare = clean()
    bare.weights = {"n_tensors": 4, "nonfinite": []}
    assert render_text(bare, 100).count("✔ no NaN/Inf found") == 1  # nothing between header and verdict


def test_bisect_shows_what_to_keep_before_the_verdict():
    lines = render_text(bisect(), 100).splitlines()
    assert lines[-2:] == [
        "keep down → fp32",
        "✔ keep 1 module(s) in fp32: the fp16 run is finite, max rel err 0 (4 runs)",
    ]


def test_render_writes_on_the_given_console():
    c, buf = _plain(100)
    render(nan_weights(), c)
    out = buf.getvalue()
    assert "weights: non-finite" in out and "up.weight" in out and "diagnosis · nonfinite_weights" in out


@pytest.mark.parametrize("passed, strip_shown", [(True, False), (False, True)])
def test_check_views_each_checkpoint_with_its_rules(passed, strip_shown):
    rep = check(passed)
    rep.modules, rep.run = overflow().modules, overflow().run
    c, buf = _plain(100)
    render_check([rep], c)
    lines = buf.getvalue().splitlines()
    verdict = "✔ check passed" if passed else "✘ check failed"
    assert lines[0].startswith(verdict) and lines[-1].startswith(verdict)
    assert (
        any(line.startswith("check") for line in lines)
        and ("headroom per module call" in buf.getvalue()) is strip_shown
    )


def test_report_console_is_quiet_after_a_broken_pipe(monkeypatch):
    """rich's default would end the process with exit 1 (which means "non-finite found")."""
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # no file descriptor for stdout_closed to repoint
    c = console()
    assert isinstance(c, ReportConsole) and not c.quiet
    c.on_broken_pipe()
    assert c.quiet


def test_consoles_interpret_nothing_in_strings():
    buf = io.StringIO()
    c = console()
    c.file = buf
    c.print("[bold]x[/bold] :smile:")
    assert buf.getvalue() == "[bold]x[/bold] :smile:\n"
