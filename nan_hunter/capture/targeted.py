"""Targeted re-runs: hooks on one module call (or a few) during a re-run, to copy what went in and
came out. Capture is installed in this package only; these are its one-call forms, used by op
location (``call_inputs``), the backward replay (``backward_region``), ``scan --compile``'s
divergence search (``child_calls``) and ``--generate --batch`` (``rows_holding_faults``).
Every hook is removed when the re-run ends, also when it raises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..tree import detached_copy, float_tensors
from .ops import call_site


class Captured(Exception):
    """Raised by a targeted re-run's hook once it has what it came for."""


def call_inputs(
    model: nn.Module,
    rerun: Callable[[], Any],
    module_name: str,
    call_index: int,
    sites: list[str | None] | None = None,
) -> tuple[tuple, dict]:
    """Call ``rerun()`` (a forward of ``model``) and copy the inputs of ``module_name``'s
    ``call_index``-th call, then stop the forward early: nothing after that call is computed.
    ``sites``: filled with where the model's code called the module (``ops.call_site``), per call."""

    target = model.get_submodule(module_name) if module_name else model
    seen = {"n": 0}
    box: dict[str, Any] = {}

    def pre(mod: nn.Module, args: tuple, kw: dict) -> None:
        if sites is not None:
            sites.append(call_site())
        if seen["n"] == call_index:
            box["args"], box["kwargs"] = detached_copy(args), detached_copy(kw)
            raise Captured
        seen["n"] += 1

    h = target.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        rerun()
    except Captured:
        pass
    finally:
        h.remove()
    if "args" not in box:
        raise RuntimeError(f"module {module_name!r} call {call_index} did not happen on re-run")
    return box["args"], box["kwargs"]


def backward_region(
    model: nn.Module, step: Any, module_name: str, call_index: int
) -> tuple[nn.Module, tuple, dict, list[Any]]:
    """Run ``step()`` (the failing step's forward and backward) and keep, of ``module_name``'s
    ``call_index``-th call, copies of its inputs and of the gradients that reached its floating
    outputs (None for an output no gradient reached). Returns (module, args, kwargs, grads)."""
    target = model.get_submodule(module_name) if module_name else model
    seen = {"n": 0}
    box: dict[str, Any] = {}

    def keep_grad(i: int) -> Any:
        def hook(g: torch.Tensor) -> None:
            box["grads"][i] = g.detach().clone()

        return hook

    def pre(mod: nn.Module, args: tuple, kw: dict) -> None:
        if seen["n"] == call_index:
            box["args"], box["kwargs"] = detached_copy(args), detached_copy(kw)

    def post(mod: nn.Module, args: tuple, kw: dict, out: Any) -> None:
        if seen["n"] == call_index:
            outs = float_tensors(out)
            box["grads"] = [None] * len(outs)
            for i, (_, t) in enumerate(outs):
                if t.requires_grad:
                    t.register_hook(keep_grad(i))
        seen["n"] += 1

    handles = [
        target.register_forward_pre_hook(pre, with_kwargs=True),
        target.register_forward_hook(post, with_kwargs=True),
    ]
    try:
        step()
    finally:
        for h in handles:
            h.remove()
    if "args" not in box or "grads" not in box:
        raise RuntimeError(f"module {module_name!r} call {call_index} did not happen on re-run")
    return target, box["args"], box["kwargs"], box["grads"]


@dataclass
class ChildCall:
    name: str  # dotted name under the model
    module: Any
    args: tuple
    kwargs: dict
    output: Any


def child_calls(module: nn.Module, prefix: str, run_module: Callable[[], Any]) -> list[ChildCall]:
    """Run ``module`` eager once (``run_module()`` calls it) and copy what each outermost called descendant (a child, or
    the members of a child ModuleList that is never called itself) was called with and
    returned, in call order."""

    calls: list[ChildCall] = []
    open_calls: list[ChildCall | None] = []  # one entry per active descendant call
    handles = []

    def pre(name: str):
        def hook(mod: Any, a: tuple, kw: dict) -> None:
            outer = not open_calls
            open_calls.append(
                ChildCall(name, mod, detached_copy(a), detached_copy(kw), None) if outer else None
            )

        return hook

    def post(mod: Any, a: tuple, kw: dict, out: Any) -> None:
        call = open_calls.pop() if open_calls else None
        if call is not None:
            call.output = detached_copy(out)
            calls.append(call)

    try:
        for name, sub in module.named_modules():
            if not name:
                continue
            full = f"{prefix}.{name}" if prefix else name
            handles.append(sub.register_forward_pre_hook(pre(full), with_kwargs=True))
            handles.append(sub.register_forward_hook(post, with_kwargs=True))
        run_module()
    finally:
        for h in handles:
            h.remove()
    return calls


def first_call_order(model: nn.Module, run: Callable[[], Any]) -> list[str]:
    """Every module's name in the order of its first call during ``run()``."""
    order: list[str] = []
    seen: set[str] = set()
    handles = []
    for name, m in model.named_modules():

        def pre(mod: nn.Module, args: Any, name: str = name) -> None:
            if name not in seen:
                seen.add(name)
                order.append(name)

        handles.append(m.register_forward_pre_hook(pre))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return order


def rows_holding_faults(model: nn.Module, snap: Any, precision: Any) -> list[int]:
    """Batch rows with a NaN/±inf in any module output of a re-run of a kept step (``snap``, a
    ``capture.snapshot.Snapshot``) inside ``precision`` (the run's context: fp8 emulation or nothing)."""
    args, kwargs = snap.rerun()
    ids = kwargs.get("input_ids")
    n = int(ids.shape[0]) if ids is not None else 1
    bad = [False] * n

    def hook(mod: Any, a: Any, out: Any) -> None:
        for _, t in float_tensors(out):
            if t.dim() >= 1 and t.shape[0] == n:
                rows = (~torch.isfinite(t.detach())).reshape(n, -1).any(dim=1).tolist()
                for r, b in enumerate(rows):
                    bad[r] = bad[r] or b

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad(), precision:
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return [r for r, b in enumerate(bad) if b] or [0]
