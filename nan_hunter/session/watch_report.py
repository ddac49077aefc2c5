"""What ``watch(...).report()`` returns: the watch's report v1 (the one the assembler made:
``explain.assemble``), printable as every report is (``render.report_view.PrintableReport``: the
type ``nan_hunter.scan`` and ``bisect`` return). Its ``first_nonfinite``, ``diagnosis``, ``run``,
``replay`` and every other field are the report's (attributes, or keys:
``report()["first_nonfinite"]["module"]``); ``to_dict()`` is report v1 with the watch's extras as
extra keys: ``failed_inputs`` and ``n_forwards`` (read from its ``run``), ``aggregates`` (the
per-module aggregates of the forwards folded away) and ``ranks`` (under torch.distributed, one
summary per rank). ``calls`` is the report's module table (the failing step's rows as its re-run
saw them, else the calls kept in full).

``print(rep)`` shows what ``nanhunter scan`` shows in the terminal; ``rep.to_html(path)`` and
``rep.to_json(path)`` write the same files as ``--report PATH.html`` and ``--json PATH`` (the JSON:
``to_dict()``); the framework callbacks write it too."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..render.report_view import PrintableReport
from ..report import ModuleRow, Report, json_safe

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.ops import OpEvent
    from ..locate.located import Located

#: the ``checkpoint`` block of a watch's report: no checkpoint was read
WATCH_CHECKPOINT = {
    "path": "watch()",
    "format": "a live model under nan_hunter.watch()",
    "n_tensors": None,
    "bytes": None,
}

#: the keys ``to_dict()`` adds to report v1
WATCH_KEYS = ("failed_inputs", "n_forwards", "aggregates", "ranks")


class WatchReport(PrintableReport):
    """A watch's report v1, printable (module docstring). ``WatchReport(report, located, aggregates,
    ranks)`` takes the fields of ``report`` (shared, not copied)."""

    def __init__(
        self,
        report: Report | None = None,
        located: Located | None = None,
        aggregates: list[dict[str, Any]] | None = None,
        ranks: list[dict[str, Any]] | None = None,
        **fields_: Any,
    ) -> None:
        given = {f.name: getattr(report, f.name) for f in fields(Report)} if report is not None else {}
        super().__init__(**{**given, **fields_})
        self.located = located  # this process's location (None on a rank that did not locate the fault)
        self.aggregates = list(aggregates or [])
        self.ranks = ranks  # under torch.distributed: one summary per rank

    @property
    def report(self) -> WatchReport:
        """The report itself (kept from when this type was a view of one)."""
        return self

    def as_report(self) -> WatchReport:
        """This watch's report v1 (what ``nanhunter scan`` writes; no checkpoint was read): itself."""
        return self

    # -- read from the report's fields -----------------------------------------------------------
    @property
    def calls(self) -> list[ModuleRow]:
        return self.modules or []

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

    def replaced(
        self, located: Located | None = None, ranks: list[dict[str, Any]] | None = None, **fields_: Any
    ) -> WatchReport:
        """A new report: this one's fields with ``fields_`` replaced (the global answer of ranks)."""
        return WatchReport(self, located, self.aggregates, ranks, **fields_)

    # -- as the JSON report ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Report v1 (``Report.to_dict``) and the watch's extras (``WATCH_KEYS``)."""
        return {
            **super().to_dict(),
            **json_safe(
                {
                    "failed_inputs": self.failed_inputs,
                    "n_forwards": self.n_forwards,
                    "aggregates": self.aggregates,
                    "ranks": self.ranks,
                }
            ),
        }
