"""The one way a region is run again: on fresh copies of what it was given, at a precision.

``call`` runs a function (a module, a compiled wrapper) on independent copies of its arguments
under a precision's context (fp8 emulation for fp8 runs) and a grad mode, so a re-run never grows
a caller's KV cache or changes an input in place. ``copy_at`` is a deep copy of a module cast to a
precision's compute dtype (or a plain torch dtype: float64 for a reference) with its inputs cast
alike; ``run_copy`` runs it. Replay, the fix check, op location, the compiled comparison and the
op-level float64 reference all run their regions through these: the user's module and the
captured inputs are never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..dtypes import RunDtype
from ..tree import cast_floats, detached_copy
from .execute import run_context


def torch_dtype_of(at: RunDtype | torch.dtype) -> torch.dtype:
    """What a copy is cast to: a run's compute dtype (fp8 runs store activations in bf16 or fp32),
    or the torch dtype itself."""
    return at.torch_compute if isinstance(at, RunDtype) else at


def precision(at: RunDtype | torch.dtype | None) -> Any:
    """The context a run at ``at`` executes in (fp8 emulation for an fp8 run; a plain dtype: none)."""
    return run_context(at if isinstance(at, RunDtype) else None)


def call(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    at: RunDtype | torch.dtype | None = None,
    grad: bool | None = False,
) -> Any:
    """``fn`` on fresh copies of ``args``/``kwargs`` under ``at``'s context; ``grad``: the grad mode
    (None: the caller's)."""
    a, kw = detached_copy((args, kwargs))
    mode = (
        torch.set_grad_enabled(grad)
        if grad is not None
        else torch.enable_grad()
        if torch.is_grad_enabled()
        else torch.no_grad()
    )
    with mode, precision(at):
        return fn(*a, **kw)


def copy_at(
    module: nn.Module, args: tuple, kwargs: dict, at: RunDtype | torch.dtype, training: bool | None = False
) -> tuple[nn.Module, tuple, dict]:
    """A deep copy of ``module`` cast to ``at`` and fresh copies of its inputs cast alike (integer
    tensors keep their dtype). ``training``: the copy's train/eval mode (None: the module's)."""
    dt = torch_dtype_of(at)
    m = copy.deepcopy(module).to(dt)
    m.train(module.training if training is None else training)
    a, kw = cast_floats(detached_copy((args, kwargs)), dt)
    return m, a, kw


def run_copy(
    module: nn.Module, args: tuple, kwargs: dict, at: RunDtype | torch.dtype, training: bool | None = False
) -> Any:
    """A copy of ``module`` at ``at``, run without grad on copies of its inputs: its output."""
    m, a, kw = copy_at(module, args, kwargs, at, training)
    with torch.no_grad(), precision(at):
        return m(*a, **kw)
