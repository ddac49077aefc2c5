"""What a mode does unless it says otherwise (``ModeBase``): every input of a group run once, one
root call each, at the run's precision and the mode's grad mode (a model's exception is bad input);
data-set indices by the order of the root calls; the failing step re-run from what the capture
kept (``locate.rerun.KeptSteps``); no facts of its own. A mode subclasses it and implements what
one input runs (``run_input``) and whatever else differs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..capture.run import forward
from ..locate.rerun import KeptSteps
from .protocol import Capture

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.recorder import Recorder
    from ..locate.located import Located
    from ..locate.rerun import Rerun
    from ..model.prepare import Prepared
    from ..report import ModuleRow, Report


class ModeBase:
    """The defaults of the ``Mode`` protocol (``modes.protocol``)."""

    name = "base"
    one_step_table = False
    grad = False
    compares_outputs = True
    retain: int | None = None

    def check(self, p: Prepared) -> None:
        return None

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        raise NotImplementedError

    def optimizer(self, p: Prepared) -> Any:
        return None

    def groups(self, p: Prepared, indices: list[int]) -> list[list[int]]:
        return [list(indices)]  # every input under one capture, one root call each

    def run_group(self, p: Prepared, group: list[int], recorder: Recorder) -> dict[str, Any]:
        for i in group:
            kw = p.batches[i]
            recorder.input_run(
                i,
                lambda kw=kw: forward(
                    p.model, kw, p.run, lambda: self.run_input(p.model, kw, recorder), grad=self.grad
                ),
            )
        return {}

    def input_of(self, cap: Capture, step: int) -> int:
        return cap.group[step]  # one root call per input, in order

    def failed_of(self, p: Prepared, cap: Capture) -> list[int]:
        return [self.input_of(cap, s) for s in cap.recording.failed if 0 <= s < len(cap.group)]

    def renumber(self, cap: Capture, table: list[ModuleRow]) -> list[ModuleRow]:
        for row in table:
            row["input_index"] = self.input_of(cap, row["input_index"])
        return table

    def absorbed(self, p: Prepared, indices: list[int]) -> list[dict[str, Any]]:
        return []

    def facts(self, p: Prepared, caps: list[Capture], failed: list[int]) -> dict[str, Any]:
        return {}

    def rerun(self, p: Prepared, cap: Capture) -> Rerun:
        return KeptSteps(cap.recorder, cap.keep.contexts, p.run)

    def place(self, p: Prepared, cap: Capture, loc: Located) -> None:
        index = self.input_of(cap, loc.first.input_index)
        loc.first.input_index, loc.first.step = index, 0  # the step within the input: its one root call
        loc.input_label = p.labels[index]

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        return None
