"""The terminal view of reports (the only place rich is used, with ``render/progress.py``).

Fits the console's width (80 columns, pipes included): names shortened in the middle, numbers
never cut, wrapped lines indented. The limits are parameters named after their configuration
keys (``near_miss.max_listed``, ``weights.max_rows``, ``weights.targets``) so the CLI passes them
from the configuration; the defaults are those of configs/default.yaml.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from ...config import default_config
from ...outputs import stdout_closed
from ...report import Report
from ..rows import FORECAST_MAX_LISTED, NEAR_MISS_MAX_LISTED, WEIGHTS_MAX_ROWS, WEIGHTS_TARGETS
from .check_view import check_verdict, results_table
from .scan_view import (
    bisect_view,
    diagnosis_panel,
    findings,
    generate_table,
    header,
    producer_panel,
    verdict,
    weights_tables,
)
from .strip import headroom_strip

__all__ = ["console", "render", "render_body", "render_check", "render_text"]


class ReportConsole(Console):
    """rich's console, except when the reader of stdout goes away (``nanhunter scan X | head -1``):
    rich's default ends the process with exit 1, which means "a non-finite value was found". Here
    the rest of the view is dropped and the command goes on to its other outputs and its own exit
    code."""

    def on_broken_pipe(self) -> None:

        self.quiet = True
        stdout_closed()


def console(stderr: bool = False) -> Console:
    """A console for reports: stdout, or stderr when stdout carries JSON. Markup, emoji codes and
    highlighting are off, so nothing in a printed string is interpreted."""
    return ReportConsole(stderr=stderr, markup=False, emoji=False, highlight=False)


def render_body(
    rep: Report,
    c: Console,
    *,
    strip: bool = False,
    near_miss_max_listed: int = NEAR_MISS_MAX_LISTED,
    weights_max_rows: int = WEIGHTS_MAX_ROWS,
    weights_targets: Sequence[str] = WEIGHTS_TARGETS,
    first: Text | None = None,
    forecast_max_listed: int = FORECAST_MAX_LISTED,
) -> None:
    """Header, ``first`` (the verdict, stated up front), weights, headroom strip (``strip`` and
    module rows), producer and diagnosis panels, near misses and notes."""
    width = c.width
    rest = [
        *weights_tables(rep, width, weights_max_rows, weights_targets),
        headroom_strip(rep, width) if strip else None,
        generate_table(rep, width),
        producer_panel(rep, width),
        diagnosis_panel(rep, width),
        findings(rep, width, near_miss_max_listed, forecast_max_listed),
    ]
    # stated up front only when something comes between it and the verdict at the end
    parts = [header(rep, width), first if any(p is not None for p in rest) else None, *rest]
    for part in parts:
        if part is not None:
            c.print(part)


def render(
    rep: Report,
    c: Console | None = None,
    *,
    strip: bool = False,
    stderr: bool = False,
    near_miss_max_listed: int = NEAR_MISS_MAX_LISTED,
    weights_max_rows: int = WEIGHTS_MAX_ROWS,
    weights_targets: Sequence[str] = WEIGHTS_TARGETS,
    forecast_max_listed: int = FORECAST_MAX_LISTED,
) -> None:
    """The full terminal view of one report on ``c`` (default: ``console(stderr)``); ``strip``
    adds the per-module headroom strip."""
    c = c or console(stderr)
    line = verdict(rep, c.width)
    render_body(
        rep,
        c,
        strip=strip,
        near_miss_max_listed=near_miss_max_listed,
        weights_max_rows=weights_max_rows,
        weights_targets=weights_targets,
        first=line,
        forecast_max_listed=forecast_max_listed,
    )
    found = bisect_view(rep, c.width)
    if found is not None:
        c.print(found)
    c.print(line)


def render_text(rep: Report, width: int | None = None, *, strip: bool = False) -> str:
    """``render`` as plain text (no colour), ``width`` columns (default: the terminal's): what
    ``print(report)`` shows."""
    buf = io.StringIO()
    render(
        rep, plain_console(buf, width), strip=strip, forecast_max_listed=default_config().forecast.max_listed
    )
    return buf.getvalue()


def check_text(reps: list[Report], width: int | None = None) -> str:
    """``render_check`` as plain text (no colour), ``width`` columns (default: the terminal's): what
    ``print(report)`` shows for a check report."""
    buf = io.StringIO()
    render_check(reps, plain_console(buf, width))
    return buf.getvalue()


def plain_console(buf: io.StringIO, width: int | None = None) -> Console:
    """A console writing plain text (no colour) into ``buf``, ``width`` columns (default: the
    terminal's)."""
    return Console(
        file=buf,
        width=width or shutil.get_terminal_size((100, 24)).columns,
        markup=False,
        emoji=False,
        highlight=False,
        color_system=None,
    )


def render_check(
    reps: list[Report],
    c: Console | None = None,
    strip: bool | None = None,
    *,
    stderr: bool = False,
    near_miss_max_listed: int = NEAR_MISS_MAX_LISTED,
    weights_max_rows: int = WEIGHTS_MAX_ROWS,
    weights_targets: Sequence[str] = WEIGHTS_TARGETS,
) -> None:
    """Per checkpoint: the scan panels (the strip by default only when it failed), its rule
    results; then one verdict line for the whole check."""
    c = c or console(stderr)
    c.print(check_verdict(reps, c.width))
    for rep in reps:
        show = strip if strip is not None else not (rep.check or {}).get("passed", True)
        render_body(
            rep,
            c,
            strip=bool(show),
            near_miss_max_listed=near_miss_max_listed,
            weights_max_rows=weights_max_rows,
            weights_targets=weights_targets,
        )
        c.print(results_table(rep, c.width))
        c.print()
    c.print(check_verdict(reps, c.width))
