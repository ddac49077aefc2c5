"""The harness's protocol: what a mode is (``Mode``), what its run leaves (``Recording``) and how
that becomes the report (``fill``), the same for every mode and for the ranks of a split run
(``modes.rank_split``). ``harness.run_mode`` drives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from ..explain.assemble import Located
    from ..locate.producer import Finding
    from ..model.prepare import Prepared
    from ..report import Report


@dataclass
class Recording:
    """What a mode's run of some inputs left, judged (steps numbered by data-set index)."""

    finding: Finding | None  # the first fault at module level
    first_input: int | None  # the data-set index of the input holding it
    failed: list[int]  # data-set indices of the inputs that went non-finite
    table: list[dict[str, Any]]  # module rows (per call), in data-set order
    notes: list[str] = field(default_factory=list)  # mask notes
    absorbed: list[dict[str, Any]] = field(default_factory=list)  # near misses: ops absorbed before any output
    extra: dict[str, Any] = field(default_factory=dict)  # the mode's own run facts, JSON (merged across ranks)
    state: Any = None  # the mode's own handles (its watch, its decodings), for ``locate`` on this process


class Mode(Protocol):
    """One way of running the model (module docstring)."""

    name: str
    #: the module table is the failing step's (else the last input's), not every input's (``generate``)
    one_step_table: bool

    def check(self, p: Prepared) -> None:
        """Refuse (``BadInput``) what this model or these inputs cannot do, before anything runs."""

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        """What one input runs; its float outputs (empty when there is nothing to compare)."""

    def record(self, p: Prepared, indices: list[int]) -> Recording:
        """Run ``indices`` of ``p.batches`` under capture and judge them."""

    def locate(self, p: Prepared, rec: Recording, replay: bool) -> Located:
        """Re-run the failing step of ``rec`` for the module, the op, the replay and the evidence."""

    def merge(self, extras: list[dict[str, Any]]) -> dict[str, Any]:
        """The run facts of several ranks' recordings as one (data-set order)."""

    def finish(self, p: Prepared, rep: Report, extra: dict[str, Any], located: Located | None) -> None:
        """The mode's own report fields (``run.generate``, ``run.loss``) from the merged facts."""


def fill(p: Prepared, mode: Mode, rep: Report, rec: Recording, located: Located | None) -> None:
    """The report from a (merged) recording and the located first fault, the same for every mode."""
    from ..explain.assemble import assemble, failed_note, input_rows, near_misses, run_info

    rep.run = run_info(p, rec.failed)
    rep.modules = rec.table
    rep.notes += [n for n in rec.notes if n not in rep.notes]
    rep.inputs = input_rows(p.labels, rec.failed)
    if located is None:
        rep.near_misses = near_misses(rep.modules, p.run, p.cfg, []) + rec.absorbed
    else:
        assemble(rep, located, p.cfg)
    mode.finish(p, rep, rec.extra, located)
    note = failed_note(p.labels, rec.failed)
    if note:
        rep.notes.append(note)
