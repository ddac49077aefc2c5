"""What ``watch(...).report()`` returns: a view of the watch's report v1 (the one the assembler
made: ``explain.assemble``), not a second report. Its ``first_nonfinite``, ``diagnosis``, ``run``
and ``replay`` are the report's (attributes, or keys: ``report()["first_nonfinite"]["module"]``);
``calls`` is the report's module table (the failing step's rows as its re-run saw them, else the
calls kept in full), ``failed_inputs`` and ``n_forwards`` are read from its ``run``; besides the
report, the view carries the per-module aggregates of the forwards folded away and, under
torch.distributed, one summary per rank.

``print(rep)`` shows what ``nanhunter scan`` shows in the terminal; ``rep.to_html(path)`` and
``rep.to_json(path)`` write the same files as ``--report PATH.html`` and ``--json PATH``; the
framework callbacks write ``as_report()`` too."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..config import default_config
from ..report import Diagnosis, FirstNonfinite, Report, RunInfo, write_json

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.ops import OpEvent
    from ..locate.located import Located

#: the ``checkpoint`` block of a watch's report: no checkpoint was read
WATCH_CHECKPOINT = {"path": "watch()", "format": "a live model under nan_hunter.watch()", "n_tensors": None,
                    "bytes": None}


class WatchReport:
    """A view of a watch's report v1 (module docstring)."""

    def __init__(self, report: Report, located: Located | None = None, aggregates: list[dict[str, Any]] | None = None,
                 ranks: list[dict[str, Any]] | None = None) -> None:
        self.report = report
        self.located = located  # this process's location (None on a rank that did not locate the fault)
        self.aggregates = list(aggregates or [])
        self.ranks = ranks  # under torch.distributed: one summary per rank

    # -- the report's fields ---------------------------------------------------------------------
    @property
    def first_nonfinite(self) -> FirstNonfinite | None:
        return self.report.first_nonfinite

    @property
    def diagnosis(self) -> Diagnosis | None:
        return self.report.diagnosis

    @property
    def run(self) -> RunInfo | None:
        return self.report.run

    @property
    def replay(self) -> dict[str, dict[str, Any]] | None:
        return self.report.replay

    @property
    def notes(self) -> list[str]:
        return self.report.notes

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.report.modules or []

    @property
    def forecast(self) -> list[dict[str, Any]] | None:
        """Contract v1.4: the overflow forecast from the sampled steps (docs/forecast.md)."""
        return self.report.forecast

    @property
    def warnings(self) -> list[dict[str, Any]]:
        """Contract v1.4: the precursor warnings (never faults)."""
        return self.report.warnings

    @property
    def failed_inputs(self) -> list[int]:
        return list(self.run.failed_inputs) if self.run is not None else []

    @property
    def n_forwards(self) -> int:
        return self.run.n_inputs if self.run is not None else 0

    # -- what the location knows besides the report ----------------------------------------------
    @property
    def op_event(self) -> OpEvent | None:
        return self.located.event if self.located is not None else None

    @property
    def optimizer_facts(self) -> dict[str, Any] | None:
        return self.located.optimizer_facts if self.located is not None else None

    @property
    def op_missing(self) -> str | None:
        """The note saying why no op was named (one of ``notes``), if any."""
        return self.located.op_missing if self.located is not None else None

    def replaced(self, located: Located | None = None, ranks: list[dict[str, Any]] | None = None,
                 **fields: Any) -> WatchReport:
        """A new view of a copy of the report with ``fields`` replaced (the global answer of ranks)."""
        return WatchReport(dataclasses.replace(self.report, **fields), located, self.aggregates, ranks)

    # -- as the JSON report ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"first_nonfinite": asdict(self.first_nonfinite) if self.first_nonfinite else None,
                "diagnosis": asdict(self.diagnosis) if self.diagnosis else None,
                "run": self.run.to_dict() if self.run is not None else None,
                "modules": self.calls, "failed_inputs": self.failed_inputs, "notes": self.notes,
                "aggregates": self.aggregates, "n_forwards": self.n_forwards, "ranks": self.ranks,
                "replay": self.replay, "forecast": self.forecast, "warnings": self.warnings}

    def as_report(self) -> Report:
        """This watch's report v1 (what ``nanhunter scan`` writes; no checkpoint was read)."""
        return self.report

    def render(self, width: int | None = None) -> str:
        """The terminal view (``nanhunter scan``'s) as plain text, ``width`` columns (default: the
        terminal's)."""
        import io
        import shutil

        from rich.console import Console  # lazy: rich and the views load only when a report is shown

        from ..render.terminal import render  # lazy: as rich

        buf = io.StringIO()
        c = Console(file=buf, width=width or shutil.get_terminal_size((100, 24)).columns, markup=False, emoji=False,
                    highlight=False, color_system=None)
        render(self.report, c, strip=self.first_nonfinite is not None,
               forecast_max_listed=default_config().forecast.max_listed)
        return buf.getvalue()

    def __str__(self) -> str:
        return self.render()

    def to_html(self, path: str) -> None:
        """Write the HTML report (as ``--report PATH.html``; ``.md`` writes Markdown)."""
        from ..render.report_file import write_report  # lazy: the HTML/Markdown views load only when written

        write_report(self.report, path)

    def to_json(self, path: str) -> None:
        """Write the JSON report v1 (as ``--json PATH``; ``-`` for stdout)."""
        write_json(self.report, path)

    def __getitem__(self, key: str) -> Any:
        """Keys as in the JSON report: ``report()["first_nonfinite"]["module"]``."""
        d = self.to_dict()
        if key not in d:
            raise KeyError(key)
        return d[key]
