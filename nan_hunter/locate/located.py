"""What location found about the first fault, in typed fields (never in note text): the one
answer ``locate.first_fault.locate`` gives, whoever recorded the run, and what
``explain.assemble`` turns into the report (after the replay, the diagnosis and the fix check,
done there once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..report import Diagnosis, FirstNonfinite, ModuleRow, ReplayRow

if TYPE_CHECKING:  # pragma: no cover
    from ..capture.ops import OpEvent
    from ..dtypes import RunDtype
    from .region import AnyRegion


@dataclass
class Located:
    """The first fault, located."""

    first: FirstNonfinite
    run: RunDtype | None  # the precision the failing ops ran in (the run's, or the step's autocast)
    event: OpEvent | None = None  # the aten op that made it (None: arrived non-finite, or not re-run)
    region: AnyRegion | None = None  # what the replay and the fix check re-run; this process only
    is_block: bool = False  # the module is one of the model's repeated blocks
    input_label: str | None = None
    optimizer_facts: dict[str, Any] | None = None  # optimizer faults: locate.training_phases.optimizer_facts
    table: list[ModuleRow] | None = None  # module rows of the failing step as its re-run saw them
    notes: list[str] = field(default_factory=list)
    row: int | None = None  # the batch row holding it (a decode step of several prompts: which prompt)
    op_missing: str | None = None  # the note saying why no op was named (one of ``notes``), if any
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # mode fields for ``run`` (generate: the fault's token)
    replay: dict[str, ReplayRow] | None = (
        None  # the failing region in every dtype (``explain``; or from another rank)
    )
    diagnosis: Diagnosis | None = None  # made by ``explain`` (or by the rank that located it)
