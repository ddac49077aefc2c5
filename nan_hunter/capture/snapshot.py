"""What a root forward was called with, kept so that ``report()`` can re-run it later.

``Snapshot.of(args, kwargs)`` copies the *structure* (tuples, dicts, ``ModelOutput``, and plain
objects such as a transformers ``DynamicCache`` and its layers) and keeps tensors by reference,
with their version counters: cheap enough for every forward, and immune to a later forward
growing the same cache object (``DynamicCache.update`` rebinds its layers' tensors). ``pin()``
turns the references into copies once the forward is known to be the one a report needs.
``rerun()`` gives a fresh copy to run from, so a re-run never touches the user's objects.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MAX_DEPTH = 8  # deeper than any real forward signature; bounds hostile or cyclic structures
_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device, torch.Generator,
           nn.Module, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)


def copy_structure(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with containers and plain objects copied and ``fn`` applied to every tensor;
    shared objects stay shared (a memo, as ``copy.deepcopy`` keeps), modules and functions are
    kept as they are."""
    memo: dict[int, Any] = {}

    def rec(x: Any, depth: int) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                memo[id(x)] = fn(x)
            return memo[id(x)]
        if isinstance(x, _LEAVES) or depth > MAX_DEPTH:
            return x
        if id(x) in memo:
            return memo[id(x)]
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # named tuple
            new = type(x)(*[rec(v, depth + 1) for v in x])
        elif type(x) in (list, tuple):
            new = type(x)(rec(v, depth + 1) for v in x)
        elif type(x) is dict:
            new = {k: rec(v, depth + 1) for k, v in x.items()}
        else:
            try:
                new = copy.copy(x)
            except Exception:  # noqa: BLE001 - an object that cannot be copied is kept as it is
                return x
            memo[id(x)] = new
            if isinstance(x, dict):  # ModelOutput and other dict subclasses
                for k, v in x.items():
                    dict.__setitem__(new, k, rec(v, depth + 1))
            if isinstance(x, list):
                list.__init__(new, [rec(v, depth + 1) for v in x])
            state = getattr(new, "__dict__", None)
            if isinstance(state, dict):
                for k, v in list(state.items()):
                    state[k] = rec(v, depth + 1)
            return new
        memo[id(x)] = new
        return new

    return rec(obj, 0)


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


@dataclasses.dataclass
class Snapshot:
    """A root forward's arguments: structure copied, tensors by reference (or, pinned, copies)."""

    args: tuple
    kwargs: dict
    versions: list[tuple[torch.Tensor, int]]
    pinned: bool = False
    changed: int = 0  # tensors changed in place between the forward's start and pin()

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> Snapshot:
        vs: list[tuple[torch.Tensor, int]] = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            if not t.is_inference():  # inference tensors have no version counter
                vs.append((t, t._version))
            return t

        a, k = copy_structure((args, kwargs), keep)
        return cls(a, k, vs)

    def pin(self) -> None:
        """Replace the references by copies (of the values as the forward started, when no one
        changed them in place since; otherwise as they are now, counted in ``changed``)."""
        if self.pinned:
            return
        self.changed = sum(1 for t, v in self.versions if t._version != v)
        self.args, self.kwargs = copy_structure((self.args, self.kwargs), _clone)
        self.versions = []
        self.pinned = True

    def changed_since(self) -> int:
        """Tensors changed in place since the forward started (0 once pinned: see ``changed``)."""
        return self.changed if self.pinned else sum(1 for t, v in self.versions if t._version != v)

    def rerun(self) -> tuple[tuple, dict]:
        """A fresh copy of (args, kwargs) to run from."""
        return copy_structure((self.args, self.kwargs), _clone)
