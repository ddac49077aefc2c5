"""What ``watch(...).report()`` returns: the same ``first_nonfinite``, ``diagnosis`` and ``run``
as the JSON report (attributes, or keys: ``report()["first_nonfinite"]["module"]``), the module
table of the calls kept in full, and per-module aggregates of the forwards folded away."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..capture.ops import OpEvent
from ..report import Diagnosis, FirstNonfinite, RunInfo


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

    def to_dict(self) -> dict[str, Any]:
        return {"first_nonfinite": asdict(self.first_nonfinite) if self.first_nonfinite else None,
                "diagnosis": asdict(self.diagnosis) if self.diagnosis else None,
                "run": self.run.to_dict() if self.run is not None else None,
                "modules": self.calls, "failed_inputs": self.failed_inputs, "notes": self.notes,
                "aggregates": self.aggregates, "n_forwards": self.n_forwards, "ranks": self.ranks}

    def __getitem__(self, key: str) -> Any:
        """Keys as in the JSON report: ``report()["first_nonfinite"]["module"]``."""
        d = self.to_dict()
        if key not in d:
            raise KeyError(key)
        return d[key]
