"""The report ``nan_hunter.scan`` and ``nan_hunter.bisect`` return: report v1 (``report.Report``,
the same data and fields) that also shows itself as the command does, like a watch report:
``print(report)`` is the terminal view, ``to_html(path)`` and ``to_json(path)`` write what
``--report`` and ``--json`` write. (``report.py`` holds data only; the views are above it.)"""

from __future__ import annotations

from dataclasses import fields

from ..report import Report, write_json
from .report_file import write_report


class PrintableReport(Report):
    """A ``Report`` that prints (``render``), and writes its HTML and JSON files."""

    def render(self, width: int | None = None) -> str:
        """The terminal view (``nanhunter scan``'s, or ``bisect``'s) as plain text, ``width``
        columns (default: the terminal's); the headroom strip is shown for a failing run, as the
        CLI shows it."""
        from .terminal import render_text  # lazy: rich

        return render_text(self, width, strip=self.exit_code() != 0)

    def __str__(self) -> str:
        return self.render()

    def to_html(self, path: str) -> None:
        """Write the HTML report (as ``--report PATH.html``; ``.md`` writes Markdown and its PNG)."""

        write_report(self, path)

    def to_json(self, path: str) -> None:
        """Write the JSON report v1 (as ``--json PATH``; ``-`` for stdout)."""
        write_json(self, path)


def printable(rep: Report) -> PrintableReport:
    """``rep``'s fields (shared, not copied) in a ``PrintableReport``."""
    return PrintableReport(**{f.name: getattr(rep, f.name) for f in fields(rep)})
