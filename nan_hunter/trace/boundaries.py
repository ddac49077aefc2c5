"""A compiled run's module boundaries, for a trace (``scan --compile --trace``, level modules).

Inside a compiled region no module hook runs, so a trace of a ``torch.compile``d model holds the
root call only, and ``nanhunter diff`` against eager could name nothing but the root. Here, as
``scan --compile`` searches (modes/compiled.py), each module is compiled alone and fed the inputs
eager gave it: ``eager_calls`` runs the model eagerly and keeps every module call's inputs
(completion order, the trace's order); ``compiled_alone`` runs each called module compiled alone
on them. The trace then holds, for every module call, what that module computes when compiled,
from eager's inputs: paired with the eager trace, every call's inputs agree, and the first call
whose compiled output parts from eager's is where compile changed the numbers.

Each compile is fresh (``torch._dynamo.reset()`` before it and after the last): modules of one
class share their ``forward``'s code object, and without a reset the recompile limit would
silently run later ones eagerly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..capture.listener import CallObserver
from ..capture.recorder import Recorder


@dataclass
class ModuleCall:
    """One module call of an eager run: its name, module, call number and (copied) inputs."""

    name: str
    module: nn.Module
    call_index: int
    args: tuple
    kwargs: dict


def _copy(obj: Any) -> Any:
    return tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, obj)


class _EagerCalls(CallObserver):
    """Keeps every non-root module call of one eager run, with a copy of its inputs."""

    def __init__(self) -> None:
        self.calls: list[ModuleCall] = []
        self.stack: list[ModuleCall] = []
        self.counts: dict[str, int] = {}

    def call_start(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        k = self.counts.get(name, 0)
        self.counts[name] = k + 1
        self.stack.append(ModuleCall(name, module, k, _copy(args), _copy(kwargs)))

    def call_end(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self.stack and self.stack[-1].name == name:
            call = self.stack.pop()
            if name:
                self.calls.append(call)


def eager_calls(model: nn.Module, args: tuple, kwargs: dict) -> list[ModuleCall]:
    """Every non-root module call of ``model(*args, **kwargs)`` run eagerly, in completion order,
    with a copy of its inputs (taken before the call: an in-place op inside cannot change it); seen
    through a bare ``capture.Recorder`` (no capture of its own) with a call observer."""
    seen = _EagerCalls()
    with Recorder(model, capture=False, observers=[seen]), torch.no_grad():
        model(*args, **kwargs)
    return seen.calls


@contextlib.contextmanager
def _fresh() -> Iterator[None]:
    import torch._dynamo

    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


def compiled_alone(calls: list[ModuleCall], backend: str) -> Iterator[tuple[ModuleCall, Any, str | None]]:
    """(call, the module's output compiled alone on the call's inputs, None) per call; where a
    module cannot be compiled or run alone: (call, None, why)."""
    for call in calls:
        try:
            with _fresh(), torch.no_grad():
                out = torch.compile(call.module, backend=backend)(*call.args, **call.kwargs)
        except Exception as e:  # noqa: BLE001 - one module that will not compile alone is left out
            yield (
                call,
                None,
                f"{call.name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
            )
            continue
        yield call, out, None
