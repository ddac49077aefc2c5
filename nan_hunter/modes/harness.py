"""The one harness: every mode runs behind the same protocol, and the harness does the rest.

A ``Mode`` (``forward``, ``generate``, ``backward``, a capsule's step) says three things:

- ``run_input(model, kwargs, recorder)``: what one input of the data set runs (a forward, a
  ``generate()`` loop, a forward and the backward of a loss), returning the float outputs to
  compare; the harness, ``check`` and bisect's mixed-precision runs all call it;
- ``record(p, indices)``: those inputs run under capture (a ``session.Watch`` or ``capture``'s
  recorder: capture is installed there and only there), judged by the producer rule into a
  ``Recording`` whose steps are data-set indices;
- ``locate(p, recording, replay)``: the failing step re-run from what was kept, for the module,
  the aten op, the replay matrix and the evidence: a ``explain.assemble.Located``.

``run_mode`` then fills the report the same way for every mode (run block, module table, inputs,
mask notes, near misses, the located fault through the one assembler). Under torchrun the data
set is split across ranks by a layer around the same protocol (``modes.rank_split``):
each rank records its share, the rank holding the first fault locates it, and every rank merges
the same report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .recording import Mode, fill

if TYPE_CHECKING:  # pragma: no cover
    from ..model.prepare import Prepared
    from ..report import Report


def run_mode(p: Prepared, mode: Mode, rep: Report, replay: bool = True) -> None:
    """Run ``mode`` over every input of ``p`` and fill ``rep`` (under torchrun the layer above,
    ``modes.rank_split.run_mode_on_ranks``, splits the data set across ranks)."""
    mode.check(p)
    from ..progress import stage

    with stage("capture"):
        rec = mode.record(p, list(range(len(p.batches))))
    located = mode.locate(p, rec, replay) if rec.finding is not None else None
    fill(p, mode, rep, rec, located)
