"""The forward mode: one no-grad forward per input (``nanhunter scan``, ``check``, bisect).

Every input runs under one capture. Its failing step is re-run from the captured input; the
module's offloaded weights are put in place for its re-runs (``--device-map``), and a fix is
checked on a copy of the whole model where the model is in memory. A clean run's inputs are run
once more at level "ops" for values absorbed before any module output (near misses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..explain.assemble import near_misses
from ..kernels.compare import flat
from ..locate.rerun import KeptSteps
from ..model.placement import materialized
from ..model.whole import WholeModel
from .base import ModeBase
from .harness import capture

if TYPE_CHECKING:  # pragma: no cover
    from ..locate.rerun import Rerun
    from ..model.prepare import Prepared
    from .protocol import Capture


class ForwardMode(ModeBase):
    name = "forward"

    @classmethod
    def wanted(cls, request: Any) -> bool:
        return True  # one forward per input: what any other request falls back to

    @classmethod
    def from_request(cls, request: Any) -> ForwardMode:
        return cls()

    def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
        return flat(model(**kwargs))

    def absorbed(self, p: Prepared, indices: list[int]) -> list[dict[str, Any]]:
        if not p.cfg.near_miss.absorbed_intermediates or not indices:
            return []
        return near_misses([], p.run, p.cfg, capture(p, self, list(indices), level="ops").recorder.op_records)

    def rerun(self, p: Prepared, cap: Capture) -> Rerun:
        # the whole model is copied for the fix check only where it is in memory: a placed model
        # (--device-map) keeps offloaded weights on meta between calls, so its failing module is checked alone
        placed = getattr(p.model, "hf_device_map", None) is not None
        return KeptSteps(
            cap.recorder,
            cap.keep.contexts,
            p.run,
            around=lambda name: materialized(p.model, name),
            whole=None
            if placed
            else lambda step: WholeModel(p.model, (), p.batches[self.input_of(cap, step)], p.master),
        )
