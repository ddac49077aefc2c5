"""The op-level step of location: re-run the producing module call from copies of its inputs
under ``FirstBadOp`` and name the first aten op that made a non-finite value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..capture.ops import OpEvent, first_bad_op
from ..capture.targeted import call_inputs
from ..dtypes import RunDtype
from ..model.execute import run_context
from ..tree import detached_copy
from .producer import Finding


def locate_op(
    model: nn.Module,
    rerun: Callable[[], Any],
    finding: Finding,
    run: RunDtype | None = None,
    grad: bool | None = False,
) -> tuple[OpEvent | None, nn.Module, tuple[Any, ...], dict[str, Any]]:
    """Re-run (``rerun``, a forward of ``model``) to copy the finding's module inputs, then replay
    that module under ``FirstBadOp`` at ``run``'s precision. Returns (op event or None, module,
    args, kwargs); data that was bad on arrival (role "input") has no producing op. ``grad``: the
    grad mode of the op-level re-run (None: the caller's, as a watched forward had it)."""
    c = finding.call
    target = model.get_submodule(c.module) if c.module else model
    if finding.role == "input":
        return None, target, (), {}
    sites: list[
        str | None
    ] = []  # where the model's code called the module, for ops with no line of their own
    args, kwargs = call_inputs(model, rerun, c.module, c.call_index, sites)
    site = sites[c.call_index] if len(sites) > c.call_index else None
    a, kw = detached_copy((args, kwargs))  # the module may change its inputs (a KV cache grows)
    with run_context(run):
        ev, _ = first_bad_op(target, a, kw, grad=grad, site=site, prefix=f"{c.module}." if c.module else "")
    return ev, target, args, kwargs
