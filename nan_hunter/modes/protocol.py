"""The harness's protocol: what a mode is (``Mode``), what capturing a group of inputs leaves
(``Capture``), what a mode's run of some inputs leaves, judged in data-set numbering (``ModeRun``),
and how that becomes the report (``fill``), the same for every mode and for the ranks of a split
run (``modes.rank_split``). ``harness`` drives it; ``base.ModeBase`` is what a mode does unless it
says otherwise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..explain.assemble import assemble, failed_note, input_rows, near_misses, run_info

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.listener import KeepSteps
    from ..capture.recorder import Recorder
    from ..locate.judged_recording import Recording
    from ..locate.located import Located
    from ..locate.rerun import Rerun
    from ..model.prepare import Prepared
    from ..report import ModuleRow, Report


@dataclass
class Capture:
    """One group of inputs run under one capture: the data-set indices it ran, the recorder, what
    it kept of each step (inputs, contexts), the recording judged, and the mode's own facts."""

    group: list[int]
    recorder: Recorder
    keep: KeepSteps
    recording: Recording
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModeRun:
    """What a mode's run of some inputs left, judged (data-set indices throughout)."""

    first_input: int | None  # the data-set index of the input holding the first fault
    failed: list[int]  # data-set indices of the inputs that went non-finite
    table: list[ModuleRow]  # module rows (per call), in data-set order
    notes: list[str] = field(default_factory=list)  # mask notes
    absorbed: list[dict[str, Any]] = field(
        default_factory=list
    )  # near misses: ops absorbed before any output
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # the mode's own run facts, JSON (merged across ranks)
    capture: Capture | None = None  # the capture holding the first fault, for ``locate`` on this process


class Mode(Protocol):
    """One way of running the model: what one input runs and how its failing step is re-run.
    The harness owns the loop, the capture and the producer rule; ``ModeBase`` gives every method
    below but ``run_input`` a default."""

    name: str
    #: the module table is the failing step's (else the last input's), not every input's (``generate``)
    one_step_table: bool
    compares_outputs: bool  # ``run_input`` returns outputs to compare (not a decoding)

    # read only (a class attribute or a property)
    @property
    def grad(self) -> bool:
        """Inputs run with grad on and their backward is captured (``--backward``)."""

    @property
    def retain(self) -> int | None:
        """Steps kept in full per capture besides the first failing one (None: every step)."""

    def check(self, p: Prepared) -> None:
        """Refuse (``BadInput``) what this model or these inputs cannot do, before anything runs."""

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        """What one input runs; its float outputs (empty when there is nothing to compare)."""

    def optimizer(self, p: Prepared) -> Any:
        """An optimizer whose ``step()`` is captured with each group (a capsule's optimizer step)."""

    def groups(self, p: Prepared, indices: list[int]) -> list[list[int]]:
        """The inputs, in order, as the groups each run under one capture."""

    def run_group(self, p: Prepared, group: list[int], recorder: Recorder) -> dict[str, Any]:
        """Run ``group`` under ``recorder`` (installed); the mode's facts about the run."""

    def input_of(self, cap: Capture, step: int) -> int:
        """The data-set index of the input whose run made step ``step`` of ``cap``."""

    def failed_of(self, p: Prepared, cap: Capture) -> list[int]:
        """The data-set indices of ``cap``'s inputs that went non-finite."""

    def renumber(self, cap: Capture, table: list[ModuleRow]) -> list[ModuleRow]:
        """``cap``'s module rows in data-set numbering."""

    def absorbed(self, p: Prepared, indices: list[int]) -> list[dict[str, Any]]:
        """Near misses of a clean run: non-finite intermediates absorbed before any module output."""

    def facts(self, p: Prepared, caps: list[Capture], failed: list[int]) -> dict[str, Any]:
        """The mode's run facts from its captures (JSON: they cross ranks)."""

    def rerun(self, p: Prepared, cap: Capture) -> Rerun:
        """How the failing step of ``cap`` is run again (``locate.rerun``)."""

    def place(self, p: Prepared, cap: Capture, loc: Located) -> None:
        """The located fault in the data set's terms: its input, step and label (and mode fields)."""

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        """The run facts of several ranks' runs as one (data-set order)."""

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        """The mode's own report fields (``run.generate``, ``run.loss``) from the merged facts."""


def fill(
    p: Prepared, mode: Mode, rep: Report, run: ModeRun, located: Located | None, replay: bool = True
) -> None:
    """The report from a (merged) run and the located first fault, the same for every mode: the
    ``run`` block, the module table, the inputs, then the located fault through the one assembler
    (``explain.assemble``: replay, diagnosis and fix check, once)."""
    rep.run = run_info(p.run, p.device, len(p.batches), run.failed, inputs=list(p.labels))
    rep.modules = run.table
    rep.notes += [n for n in run.notes if n not in rep.notes]
    rep.inputs = input_rows(p.labels, run.failed)
    if located is None:
        rep.near_misses = near_misses(rep.modules, p.run, p.cfg, []) + run.absorbed
    else:
        assemble(rep, located, p.cfg, replay, device=str(p.device))
    mode.finish(p, rep, run.extra, located)
    note = failed_note(p.labels, run.failed)
    if note:
        rep.notes.append(note)
