"""The one walker over what modules take and return: tensors inside tuples, lists, dicts,
``ModelOutput`` (an OrderedDict dataclass), named tuples and dataclasses.

``float_tensors`` lists the floating tensors with a label for each (``args[0]``,
``past_key_values[1]``); ``map_tensors`` rebuilds the structure with a function applied to every
tensor. Capture, re-runs, replay, bisect and policies all go through these two.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

MAX_DEPTH = 8  # deeper than any real module signature; bounds hostile or cyclic structures
_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device)


def is_float_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_meta


def float_tensors(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Floating tensors inside ``obj`` with their labels; None and non-float tensors are skipped."""
    if isinstance(obj, torch.Tensor):
        return [(prefix or "out", obj)] if is_float_tensor(obj) else []
    if depth > MAX_DEPTH or isinstance(obj, _LEAVES):
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
            out += float_tensors(getattr(obj, f.name, None), f"{prefix}.{f.name}" if prefix else f.name, depth + 1)
    return out


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any], other: Callable[[Any], Any] | None = None,
                depth: int = 0) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor. Objects that are not containers go
    through ``other`` (default: kept as they are). Never mutates ``obj``."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, _LEAVES) or depth > MAX_DEPTH:
        return obj
    rec = lambda v: map_tensors(v, fn, other, depth + 1)  # noqa: E731
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # named tuple
        return type(obj)(*[rec(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        items = [rec(v) for v in obj]
        return items if type(obj) is list else tuple(items) if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, dict):
        items = {k: rec(v) for k, v in obj.items()}
        if type(obj) is dict:
            return items
        try:  # ModelOutput and other dict subclasses: a new instance of the same class
            new = copy.copy(obj)
            for k, v in items.items():
                new[k] = v
            return new
        except Exception:
            return items
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        try:
            return dataclasses.replace(obj, **{f.name: rec(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                               if f.init})
        except Exception:
            return other(obj) if other else obj
    return other(obj) if other else obj


def cast_floats(obj: Any, dtype: torch.dtype, device: torch.device | None = None) -> Any:
    """Floating tensors to ``dtype`` (and every tensor to ``device``); integer tensors keep their dtype."""
    def cast(t: torch.Tensor) -> torch.Tensor:
        if device is not None:
            t = t.to(device)
        return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
    return map_tensors(obj, cast)


def _deepcopy_or_same(obj: Any) -> Any:
    try:
        return copy.deepcopy(obj)
    except Exception:
        return obj


def detached_copy(obj: Any) -> Any:
    """An independent copy to re-run from: tensors detached and cloned, stateful objects such as a
    KV cache deep-copied (a re-run must never grow or change the user's)."""
    return map_tensors(obj, lambda t: t.detach().clone(), _deepcopy_or_same)
