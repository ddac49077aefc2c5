"""A capture's recording, judged by the producer rule: what ``locate`` starts from.

``Recording.of(recorder)`` reads the rows once and keeps the calls kept in full, the first fault
(``producer.first_finding``: by step, then phase, then completion order), the steps that went
non-finite, and the notes every report of it carries (absorbed −inf masks, tensors that could not
be read, forwards folded into aggregates). The watch and every mode of the harness judge their
recordings here, so a recording means the same whoever made it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..capture.recorder import Recorder
from ..capture.records import Call
from ..report import ModuleRow
from .producer import Finding, call_table, failed_inputs, first_finding, mask_notes


@dataclass
class Recording:
    """What a capture left, judged (steps are the recorder's root-call indices)."""

    recorder: Recorder
    calls: list[Call]  # the calls judged (a GradScaler's skipped backward passes left out)
    rows: Any  # the stats rows, read back once
    finding: Finding | None  # the first fault at the recording's level
    failed: list[int]  # steps that went non-finite, folded ones included
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, rec: Recorder, skipped_backward: Iterable[int] = ()) -> Recording:
        """``rec`` judged; ``skipped_backward``: steps whose backward pass is not a fault (a
        GradScaler skipped them: its scaled gradients overflowed while the unscaled ones are finite)."""
        rows = rec.sink.rows()
        skip = set(skipped_backward)
        calls = [c for c in rec.calls if not (c.phase == "backward" and c.input_index in skip)]
        notes = mask_notes(calls, rows)
        if rec.sink.unmeasured:
            kinds = sorted({why.split(":")[0] for _, why in rec.sink.unmeasured})
            notes.append(
                f"{len(rec.sink.unmeasured)} tensor(s) could not be read and were skipped (their rows "
                f"read as empty): {', '.join(kinds[:3])}"
            )
        if rec.forwards_folded:
            notes.append(
                f"{rec.forwards_folded} of {rec.n_forwards} forwards were folded into per-module "
                "aggregates (report().aggregates); the first failing forward and the latest "
                f"{rec.window} are kept in full"
            )
        failed = sorted(set(rec.failed_forwards()) | set(failed_inputs(calls, rows)))
        return cls(rec, calls, rows, first_finding(calls, rows), failed, notes)

    def table(self, steps: Iterable[int] | None = None) -> list[ModuleRow]:
        """Module rows of the calls judged (of ``steps`` only, when given)."""
        if steps is None:
            return call_table(self.calls, self.rows)
        keep = set(steps)
        return call_table([c for c in self.calls if c.input_index in keep], self.rows)

    def step_notes(self, step: int) -> list[str]:
        """The absorbed-mask notes of one step."""
        return mask_notes([c for c in self.calls if c.input_index == step], self.rows)
