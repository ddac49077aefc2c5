"""The one harness: every mode runs behind the same protocol, and the harness does the rest.

A ``Mode`` (``forward``, ``generate``, ``backward``, a capsule's step; ``modes.protocol``) says
what one input runs (``run_input``) and how its failing step is re-run (``rerun``); ``ModeBase``
(``modes.base``) is everything else unless a mode says otherwise. The harness owns the loop:

- ``capture``: a group of inputs run under a bare ``capture.Recorder`` at module level that keeps
  every step's inputs and context (``capture.listener.KeepSteps``), gradients captured when the
  mode runs with grad, the optimizer a mode gives; judged by the producer rule
  (``locate.judged_recording``);
- ``record``: every group of the inputs asked, into a ``ModeRun`` in data-set numbering (the
  failed inputs, the module table, mask notes, near misses of a clean run, the mode's facts);
- ``locate_first``: the first fault located by the one locate (``locate.first_fault``) with the
  mode's re-runs, and placed in the data set (``Mode.place``);
- ``run_mode``: then the report is filled the same way for every mode (``recording.fill``): the
  located fault is replayed, diagnosed and its fix checked once, by the one assembler.

``check`` and bisect's mixed-precision runs call ``run_input`` too. Under torchrun the data set is
split across ranks by a layer around the same protocol (``modes.rank_split``): each rank records
its share, the rank holding the first fault locates it, and every rank merges the same report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..capture.listener import CallObserver, KeepSteps
from ..capture.recorder import Recorder
from ..locate.first_fault import locate
from ..locate.judged_recording import Recording
from ..progress import stage
from .protocol import Capture, Mode, ModeRun, fill
from .trace_pass import traced

if TYPE_CHECKING:  # pragma: no cover
    from ..locate.located import Located
    from ..model.prepare import Prepared
    from ..report import Report


def capture(
    p: Prepared, mode: Mode, group: list[int], level: str = "modules", observers: Sequence[CallObserver] = ()
) -> Capture:
    """``group`` run by ``mode`` under one capture at ``level``, judged; ``observers`` see every
    module call of the same pass (``scan --trace``: ``modes.trace_pass``)."""
    keep = KeepSteps(p.model)
    rec = Recorder(
        p.model,
        level=level,
        retain=mode.retain or max(1, len(group)),
        backward=mode.grad,
        optimizer=mode.optimizer(p),
        listener=keep,
        observers=list(observers),
    )
    with rec:
        facts = mode.run_group(p, group, rec)
    return Capture(group, rec, keep, Recording.of(rec), facts)


def record(p: Prepared, mode: Mode, indices: list[int], observers: Sequence[CallObserver] = ()) -> ModeRun:
    """The inputs ``indices`` of ``p`` run by ``mode`` under capture, judged in data-set numbering."""
    caps = [capture(p, mode, g, observers=observers) for g in mode.groups(p, indices) if g]
    first = next((c for c in caps if c.recording.finding is not None), None)  # the lowest data-set index
    finding = first.recording.finding if first is not None else None
    failed = sorted({i for c in caps for i in mode.failed_of(p, c)})
    if not mode.one_step_table:
        table = [row for c in caps for row in mode.renumber(c, c.recording.table())]
        notes = [n for c in caps for n in c.recording.notes]
    elif first is not None and finding is not None:  # the failing step's rows
        step = finding.call.input_index
        table, notes = mode.renumber(first, first.recording.table([step])), first.recording.step_notes(step)
    elif caps:  # else the last capture's latest kept step
        table, notes = mode.renumber(caps[-1], caps[-1].recording.table()), caps[-1].recording.notes
    else:
        table, notes = [], []
    absorbed = mode.absorbed(p, indices) if first is None else []
    first_input = (
        mode.input_of(first, finding.call.input_index) if first is not None and finding is not None else None
    )
    return ModeRun(
        first_input, failed, table, list(dict.fromkeys(notes)), absorbed, mode.facts(p, caps, failed), first
    )


def locate_first(p: Prepared, mode: Mode, cap: Capture) -> Located:
    """The first fault of ``cap`` located by re-running its step (the one locate), placed in the data set."""
    rerun = mode.rerun(p, cap)
    with stage("locate"), rerun.kept():
        loc = locate(cap.recording, rerun)
    mode.place(p, cap, loc)
    return loc


def run_mode(p: Prepared, mode: Mode, rep: Report, replay: bool = True, trace: Any = None) -> None:
    """Run ``mode`` over every input of ``p`` and fill ``rep`` (under torchrun the layer above,
    ``modes.rank_split.run_mode_on_ranks``, splits the data set across ranks). ``trace``: a
    ``TraceRecorder`` written in the same pass as the capture (``modes.trace_pass``)."""
    mode.check(p)
    with stage("capture"), traced(trace):
        run = record(p, mode, list(range(len(p.batches))), [trace] if trace is not None else ())
    located = locate_first(p, mode, run.capture) if run.capture is not None else None
    fill(p, mode, rep, run, located, replay)
