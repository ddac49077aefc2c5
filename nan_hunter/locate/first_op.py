"""The op-level step of location: re-run the producing module call from copies of its inputs
under ``FirstBadOp`` and name the first aten op that made a non-finite value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..capture.ops import OpEvent, first_bad_op
from ..dtypes import RunDtype
from ..execute import call_inputs, run_context
from .producer import Finding


def locate_op(model: nn.Module, rerun: Callable[[], Any], finding: Finding,
              run: RunDtype | None = None) -> tuple[OpEvent | None, nn.Module, tuple, dict]:
    """Re-run (``rerun``, a forward of ``model``) to copy the finding's module inputs, then replay
    that module under ``FirstBadOp`` at ``run``'s precision. Returns (op event or None, module,
    args, kwargs); data that was bad on arrival (role "input") has no producing op."""
    c = finding.call
    target = model.get_submodule(c.module) if c.module else model
    if finding.role == "input":
        return None, target, (), {}
    args, kwargs = call_inputs(model, rerun, c.module, c.call_index)
    with run_context(run):
        ev, _ = first_bad_op(target, args, kwargs)
    return ev, target, args, kwargs
