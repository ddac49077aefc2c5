"""Location for the training phases: a backward fault down to the leaf module and aten op, an
optimizer fault down to the parameter and the optimizer state that explains it.

Both work from what a ``Watch`` kept of the failing step: the input snapshot, the ambient context,
the gradients that reached the model's outputs, and the weights as they were at the fault (when
an optimizer step has changed them since). Nothing of the user's is written: weights are rebound
for the re-run only (``execute.weights_as``), gradients are returned, not accumulated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..capture.ops import FirstBadOp, OpEvent
from ..capture.recorder import Recorder
from ..dtypes import name_of
from ..report import ModuleRow
from .backward_op import Grads, rerun_backward
from .producer import Finding, call_table, first_finding


@dataclass
class BackwardLocation:
    finding: Finding | None  # at module level (None: the re-run's gradients were finite)
    event: OpEvent | None
    table: list[ModuleRow] = field(default_factory=list)


def locate_backward(
    model: torch.nn.Module, forward: Callable[[], Any], grads: Grads, step: int, device: Any
) -> BackwardLocation:
    """Re-run the step's forward and backward twice: under module-level backward capture (which
    module), then under the op-level mode (which aten op and autograd node)."""
    fine = Recorder(model, level="modules", retain=1, device=device, backward=True, first_step=step)
    with fine:
        rerun_backward(model, forward, grads)
    rows = fine.sink.rows()
    f = first_finding([c for c in fine.calls if c.phase == "backward"], rows)
    _, ev = rerun_backward(model, forward, grads, find_op=True)
    return BackwardLocation(f, ev, call_table(fine.calls, rows))


def optimizer_facts(optimizer: Any, param: torch.Tensor, name: str) -> dict[str, Any]:
    """What explains a parameter that went non-finite in ``optimizer.step()``: the algorithm and
    its hyperparameters, eps as the parameter's dtype holds it, and the optimizer state at the
    elements that went bad (read after the step: the state the update divided by)."""
    group: dict[str, Any] = next(
        (g for g in optimizer.param_groups if any(p is param for p in g["params"])), {}
    )
    hp = {
        k: v
        for k, v in group.items()
        if k != "params" and isinstance(v, (int, float, bool, str, tuple, list))
    }
    facts: dict[str, Any] = {
        "optimizer": type(optimizer).__name__,
        "param": name,
        "dtype": (name_of(param.dtype) or str(param.dtype).removeprefix("torch.")),
        "hyperparameters": {k: list(v) if isinstance(v, tuple) else v for k, v in hp.items()},
    }
    eps = group.get("eps")
    if isinstance(eps, (int, float)):
        held = float(torch.tensor(eps, dtype=param.dtype))
        facts["eps"], facts["eps_in_dtype"] = float(eps), held
    bad = ~torch.isfinite(param.detach())
    facts["nonfinite"] = int(bad.sum())
    facts["numel"] = param.numel()
    state = optimizer.state.get(param, {})
    facts["state"] = {}
    for key, t in state.items():
        if isinstance(t, torch.Tensor) and t.shape == param.shape and t.is_floating_point():
            at = t.detach()[bad]
            facts["state"][key] = {
                "dtype": (name_of(t.dtype) or str(t.dtype).removeprefix("torch.")),
                "zeros_where_nonfinite": int((at == 0).sum()),
                "absmax_where_nonfinite": float(at.abs().max()) if at.numel() else None,
                "zeros": int((t == 0).sum()),
            }
        elif isinstance(t, torch.Tensor) and t.numel() == 1:
            facts["state"][key] = float(t)
    g = param.grad
    if g is not None and g.shape == param.shape:
        at = g.detach()[bad]
        facts["grad_zeros_where_nonfinite"] = int((at == 0).sum())
        facts["grad_absmax"] = float(g.detach().abs().max()) if g.numel() else None
    return facts


def first_bad_step(optimizer: Any) -> OpEvent | None:
    """Run ``optimizer.step()`` under the op-level mode: the aten op that first made a parameter
    non-finite (None when the step cannot run or stays finite)."""

    mode = FirstBadOp()
    try:
        with mode:
            optimizer.step()
    except Exception:  # noqa: BLE001 - an optimizer that cannot be rebuilt this way: no op named
        return None
    return mode.result


def constructor_hyperparameters(cls: type[Any], group: dict[str, Any]) -> dict[str, Any]:
    """The one filter from a param group (or its recorded JSON form) to the keyword arguments
    ``cls(params, **kw)`` takes: keys its ``__init__`` accepts, one-element tensors as floats,
    lists as tuples (``betas``)."""
    import inspect

    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    out: dict[str, Any] = {}
    for k, v in group.items():
        if k not in accepted:
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = float(v)
        out[k] = tuple(v) if isinstance(v, list) else v
    return out


def fresh_optimizer(
    cls: type,
    hyper: dict[str, Any],
    weight: torch.Tensor,
    grad: torch.Tensor,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype | None = None,
) -> tuple[Any, torch.nn.Parameter]:
    """One parameter as it was before a step, in a fresh optimizer of class ``cls`` with
    ``hyper`` (``constructor_hyperparameters``) and the recorded ``state`` — the one way an
    optimizer's step is rebuilt (op location, replay, a capsule's facts). ``dtype``: the parameter,
    its gradient and its floating state cast to it (a replay column)."""
    dt = dtype or weight.dtype
    p = torch.nn.Parameter(weight.detach().to(dt).clone())
    p.grad = grad.detach().to(dt).clone()
    o = cls([p], **hyper)
    o.state[p] = {
        k: (
            v.detach().to(dt).clone()
            if dtype is not None and v.is_floating_point() and v.dim()
            else v.detach().clone()
        )
        for k, v in state.items()
    }
    return o, p


@dataclass
class OptimizerPieces:
    """An optimizer step as it was before it ran, per parameter: enough to rebuild one parameter's
    step with a fresh optimizer of the same class, hyperparameters and state (op location, the
    replay, the facts). From a capsule (``optimizer.safetensors``) or a watch's pre-step copy."""

    cls: type
    hyper: list[dict[str, Any]]  # constructor keywords per param group (``constructor_hyperparameters``)
    groups: dict[str, int]  # parameter name -> its group
    weights: dict[str, torch.Tensor]  # as before the step
    grads: dict[str, torch.Tensor]
    state: dict[str, dict[str, torch.Tensor]]

    def has(self, name: str | None) -> bool:
        return name is not None and name in self.grads and name in self.weights

    def fresh(self, name: str, dtype: torch.dtype | None = None) -> tuple[Any, torch.nn.Parameter]:
        """Parameter ``name`` before the step, in a fresh optimizer (``fresh_optimizer``)."""
        return fresh_optimizer(
            self.cls,
            self.hyper[self.groups.get(name, 0)],
            self.weights[name],
            self.grads[name],
            self.state.get(name, {}),
            dtype,
        )

    def first_bad_op(self, name: str) -> OpEvent | None:
        """The aten op inside ``name``'s step that first made it non-finite (None: a class outside
        ``torch.optim``, which is not rebuilt, or a step that stays finite)."""
        if not self.cls.__module__.startswith("torch.optim") or not self.has(name):
            return None
        try:
            o, _ = self.fresh(name)
        except Exception:  # noqa: BLE001 - an optimizer that cannot be rebuilt this way: no op named
            return None
        return first_bad_step(o)

    def facts(self, name: str) -> dict[str, Any] | None:
        """``optimizer_facts`` of ``name`` after its step re-run from the pieces."""
        try:
            o, p = self.fresh(name)
            o.step()
        except Exception:  # noqa: BLE001
            return None
        return optimizer_facts(o, p, name)
