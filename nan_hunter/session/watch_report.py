"""What ``watch(...).report()`` returns: the same ``first_nonfinite``, ``diagnosis`` and ``run``
as the JSON report (attributes, or keys: ``report()["first_nonfinite"]["module"]``), the module
table of the calls kept in full, per-module aggregates of the forwards folded away, the replay
matrix of the failing region and the verified fix.

``print(rep)`` shows what ``nanhunter scan`` shows in the terminal; ``rep.to_html(path)`` and
``rep.to_json(path)`` write the same files as ``--report PATH.html`` and ``--json PATH``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..capture.ops import OpEvent
from ..report import Diagnosis, FirstNonfinite, Report, RunInfo


@dataclass
class WatchReport:
    """What ``watch(...).report()`` returns: the first non-finite value and per-call stats (of
    the forwards kept in full), per-module aggregates of the forwards folded away."""

    first_nonfinite: FirstNonfinite | None
    calls: list[dict[str, Any]]
    failed_inputs: list[int]
    notes: list[str] = field(default_factory=list)
    op_event: OpEvent | None = None
    aggregates: list[dict[str, Any]] = field(default_factory=list)
    n_forwards: int = 0
    run: RunInfo | None = None  # as the JSON report's (dtype, failed_inputs, scaler_skipped_steps...)
    diagnosis: Diagnosis | None = None
    ranks: list[dict[str, Any]] | None = None  # under torch.distributed: one summary per rank
    optimizer_facts: dict[str, Any] | None = None  # optimizer faults: the state that explains it
    op_missing: str | None = None  # the note saying why no op was named (one of ``notes``), if any
    replay: dict[str, dict[str, Any]] | None = None  # the failing region re-run per dtype (as the JSON report's)
    #: the failing call (module and captured inputs) of a producer fault, for the replay and the fix
    #: check; not part of the report's data
    region: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"first_nonfinite": asdict(self.first_nonfinite) if self.first_nonfinite else None,
                "diagnosis": asdict(self.diagnosis) if self.diagnosis else None,
                "run": self.run.to_dict() if isinstance(self.run, RunInfo) else self.run,
                "modules": self.calls, "failed_inputs": self.failed_inputs, "notes": self.notes,
                "aggregates": self.aggregates, "n_forwards": self.n_forwards, "ranks": self.ranks,
                "replay": self.replay}

    def as_report(self) -> Report:
        """This watch's findings as a report v1 (what ``nanhunter scan`` writes; no checkpoint)."""
        run = self.run if self.run is not None else RunInfo(
            dtype=None, device="", n_inputs=self.n_forwards, failed_inputs=list(self.failed_inputs))
        return Report(checkpoint={"path": "watch()", "format": "a live model under nan_hunter.watch()",
                                  "n_tensors": None, "bytes": None},
                      weights=None, run=run, first_nonfinite=self.first_nonfinite, replay=self.replay,
                      diagnosis=self.diagnosis, notes=list(self.notes), modules=list(self.calls), mode="watch")

    def render(self, width: int | None = None) -> str:
        """The terminal view (``nanhunter scan``'s) as plain text, ``width`` columns (default: the
        terminal's)."""
        import io
        import shutil

        from rich.console import Console

        from ..render.terminal import render

        buf = io.StringIO()
        c = Console(file=buf, width=width or shutil.get_terminal_size((100, 24)).columns, markup=False, emoji=False,
                    highlight=False, color_system=None)
        render(self.as_report(), c, strip=self.first_nonfinite is not None)
        return buf.getvalue()

    def __str__(self) -> str:
        return self.render()

    def to_html(self, path: str) -> None:
        """Write the HTML report (as ``--report PATH.html``; ``.md`` writes Markdown)."""
        from ..render.report_file import write_report

        write_report(self.as_report(), path)

    def to_json(self, path: str) -> None:
        """Write the JSON report v1 (as ``--json PATH``; ``-`` for stdout)."""
        from ..report import write_json

        write_json(self.as_report(), path)

    def __getitem__(self, key: str) -> Any:
        """Keys as in the JSON report: ``report()["first_nonfinite"]["module"]``."""
        d = self.to_dict()
        if key not in d:
            raise KeyError(key)
        return d[key]


def replay_region(region: Any, run: Any) -> dict[str, dict[str, Any]] | None:
    """The replay matrix of a watch's failing region (``explain.replay``), or None without one."""
    if region is None or run is None:
        return None
    from ..explain.replay import replay

    try:
        return replay(region.module, region.args, region.kwargs, run)
    except Exception:  # noqa: BLE001 - the report stands without its replay
        return None
