"""The one printable report: what ``nan_hunter.scan`` and ``nan_hunter.bisect`` return, what a
``check`` report prints as, and the base of what ``watch(...).report()`` returns
(``session.watch_report.WatchReport``). It is report v1 (``report.Report``, the same data and
fields) that also shows itself as the command does: ``print(report)`` is the terminal view,
``to_html(path)`` and ``to_json(path)`` write what ``--report`` and ``--json`` write, and
``report["key"]`` reads a key of ``to_dict()`` (the JSON report). (``report.py`` holds data only;
the views are above it.)"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..report import Report, write_json
from .report_file import write_report


class PrintableReport(Report):
    """A ``Report`` that prints (``render``), writes its HTML and JSON files, and reads its JSON
    keys (``report["first_nonfinite"]["module"]``)."""

    def render(self, width: int | None = None) -> str:
        """The terminal view (``nanhunter scan``'s, ``bisect``'s, or ``check``'s for a check
        report) as plain text, ``width`` columns (default: the terminal's); the headroom strip is
        shown for a failing run, as the CLI shows it."""
        from .terminal import check_text, render_text  # lazy: rich

        if self.check is not None:
            return check_text([self], width)
        return render_text(self, width, strip=self.exit_code() != 0)

    def __str__(self) -> str:
        return self.render()

    def to_html(self, path: str) -> None:
        """Write the HTML report (as ``--report PATH.html``; ``.md`` writes Markdown and its PNG)."""

        write_report(self, path)

    def to_json(self, path: str) -> None:
        """Write the JSON report v1 (as ``--json PATH``; ``-`` for stdout)."""
        write_json(self, path)

    def __getitem__(self, key: str) -> Any:
        """Keys as in the JSON report (``to_dict()``): ``report["first_nonfinite"]["module"]``."""
        d = self.to_dict()
        if key not in d:
            raise KeyError(key)
        return d[key]


def printable(rep: Report) -> PrintableReport:
    """``rep``'s fields (shared, not copied) in a ``PrintableReport``."""
    return PrintableReport(**{f.name: getattr(rep, f.name) for f in fields(rep)})
