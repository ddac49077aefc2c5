"""The terminal view of ``nanhunter check``: per checkpoint the scan panels and its rule
results, then one verdict line for the whole run."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ...report import Report
from .. import rows as R
from .layout import Col, table
from .scan_view import TONE_STYLE, t

STATUS_STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red"}


def results_table(rep: Report, width: int) -> Table:
    rows = R.check_rows(rep)
    cols = [
        Col("", [Text(R.ICON[s], style=STATUS_STYLE[s]) for s, _, _ in rows]),
        Col("rule", [t(rule, STATUS_STYLE[s] if s != "pass" else "") for s, rule, _ in rows], "name", low=20),
        Col("result", [t(msg) for _, _, msg in rows], "text", low=24),
    ]
    return table(cols, width, order=[(1, 32), (2, None)], title="check")


def check_verdict(reps: list[Report], width: int = R.VERDICT_WIDTH + 1) -> Text:
    """The check's verdict in one line of the console (79 cells on an 80-column terminal, more on a
    wider one: the failing rules' names are what it is for)."""
    v = R.check_verdict(reps, max(20, width - 1))
    line = t(v.text, TONE_STYLE[v.tone])
    line.no_wrap, line.overflow = True, "ellipsis"
    return line
