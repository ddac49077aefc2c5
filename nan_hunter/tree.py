"""The one walker over what modules take and return: tensors inside tuples, lists, dicts,
``ModelOutput`` (an OrderedDict dataclass), named tuples and dataclasses.

``float_tensors`` lists the floating tensors with a label for each (``args[0]``,
``past_key_values[1]``); ``map_tensors`` rebuilds the structure with a function applied to every
tensor. Capture, re-runs, replay, bisect and policies all go through these two.
"""

from __future__ import annotations

import copy
import copyreg
import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

MAX_DEPTH = 8  # deeper than any real module signature; bounds hostile or cyclic structures
LEAF_TYPES = (
    str,
    bytes,
    int,
    float,
    bool,
    complex,
    type(None),
    torch.dtype,
    torch.device,
    torch.Generator,
    torch.nn.Module,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def is_float_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_meta


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s local shard (``to_local()``: no collective), any other tensor itself. Reading
    a DTensor's values as a whole (``isnan().any()``, ``float(t.max())``) would be a collective."""
    if type(t) in _PLAIN:  # most tensors: no module lookup (this runs for every tensor a hook sees)
        return t
    mod = sys.modules.get("torch.distributed.tensor")  # loaded whenever a DTensor exists
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    return t.to_local() if cls is not None and isinstance(t, cls) else t


def float_tensors(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Floating tensors inside ``obj`` with their labels; None and non-float tensors are skipped.
    A DTensor (FSDP2 parameters, tensor parallelism) is given as this rank's local shard."""
    if isinstance(obj, torch.Tensor):
        return [(prefix or "out", local_shard(obj))] if is_float_tensor(obj) else []
    if depth > MAX_DEPTH or isinstance(obj, LEAF_TYPES):
        return []
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += float_tensors(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += float_tensors(v, f"{prefix}[{i}]", depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += float_tensors(
                getattr(obj, f.name, None), f"{prefix}.{f.name}" if prefix else f.name, depth + 1
            )
    return out


_PLAINLY_COPIED: dict[type, bool] = {}


def _copied_plainly(tp: type) -> bool:
    """Whether ``copy.copy`` of a ``tp`` is ``tp.__new__(tp)`` given the instance's ``__dict__``: a
    plain class (a transformers ``DynamicCache`` and its layers) that customises none of copy's
    protocol, holds no slots and is no container. Its copy is then made directly, without the
    reduce protocol's detour: ``Snapshot.of`` copies a KV cache's objects on every decode step."""
    plain = _PLAINLY_COPIED.get(tp)
    if plain is None:
        obj = object
        plain = (
            tp not in copy._copy_dispatch  # type: ignore[attr-defined]  # copy's own table; typeshed omits it
            and copyreg.dispatch_table.get(tp) is None
            and not issubclass(tp, (type, dict, list, tuple, set))
            and getattr(tp, "__copy__", None) is None
            and getattr(tp, "__setstate__", None) is None
            and tp.__reduce_ex__ is obj.__reduce_ex__
            and tp.__reduce__ is obj.__reduce__
            and getattr(tp, "__getstate__", None) is getattr(obj, "__getstate__", None)
            and getattr(tp, "__getnewargs_ex__", None) is None
            and getattr(tp, "__getnewargs__", None) is None
            and not copyreg._slotnames(tp)  # type: ignore[attr-defined]  # what copy.copy asks; typeshed omits it
            and "__dict__" in dir(tp)
        )
        _PLAINLY_COPIED[tp] = plain
    return plain


def _shallow_copy(x: Any) -> Any:
    """``copy.copy(x)``, made directly for a plainly copied type (``_copied_plainly``)."""
    tp = type(x)
    if not _copied_plainly(tp):
        return copy.copy(x)
    cls: Any = tp  # typeshed's type.__new__ overloads do not take a bare class; copy.copy calls it so
    new = cls.__new__(tp)
    state = x.__dict__
    if state:
        new.__dict__.update(state)
    return new


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor; never mutates ``obj``.

    Containers are rebuilt; plain objects that hold tensors in their attributes (a transformers
    ``DynamicCache`` and its layers, ``ModelOutput``) are shallow-copied with their attributes
    mapped, so a re-run can grow its copy of a KV cache without touching the user's. Objects
    shared inside ``obj`` stay shared in the result; modules, functions and types are kept."""
    memo: dict[int, Any] = {}

    def rec(x: Any, depth: int) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                memo[id(x)] = fn(x)
            return memo[id(x)]
        if isinstance(x, LEAF_TYPES) or depth > MAX_DEPTH:
            return x
        if id(x) in memo:
            return memo[id(x)]
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # named tuple
            new: Any = type(x)(*[rec(v, depth + 1) for v in x])
        elif type(x) in (list, tuple):
            new = type(x)(rec(v, depth + 1) for v in x)
        elif type(x) is dict:
            new = {k: rec(v, depth + 1) for k, v in x.items()}
        else:
            try:
                new = _shallow_copy(x)
            except Exception:  # an object that cannot be copied is kept as it is
                return x
            memo[id(x)] = new
            if isinstance(x, dict):  # ModelOutput and other dict subclasses
                for k, v in x.items():
                    dict.__setitem__(new, k, rec(v, depth + 1))
            elif isinstance(x, list):
                list.__init__(new, [rec(v, depth + 1) for v in x])
            state = getattr(new, "__dict__", None)
            if isinstance(state, dict):
                for k, v in list(state.items()):
                    state[k] = rec(v, depth + 1)
            return new
        memo[id(x)] = new
        return new

    return rec(obj, 0)


def cast_floats(obj: Any, dtype: torch.dtype, device: torch.device | None = None) -> Any:
    """Floating tensors to ``dtype`` (and every tensor to ``device``); integer tensors keep their dtype."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        if device is not None:
            t = t.to(device)
        return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t

    return map_tensors(obj, cast)


def detached_copy(obj: Any) -> Any:
    """An independent copy to re-run from: tensors detached and cloned, containers and stateful
    objects such as a KV cache copied (a re-run must never grow or change the user's). A tensor
    given twice is copied once, so aliasing is kept (``nn.MultiheadAttention`` takes its fused
    fast path only when ``query is key is value``)."""
    return map_tensors(obj, lambda t: t.detach().clone())
