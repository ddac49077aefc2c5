"""The floating tensors a hook sees, found fast: ``tree.float_tensors`` with a short path for the
shapes hooks meet on every call (a tensor, tuples, lists and dicts of them and their subclasses
such as ``ModelOutput`` and named tuples, None and numbers), and ``tree.float_tensors`` itself for
anything else (dataclasses, tensor subclasses such as a DTensor). Same tensors, same labels, same
order: the one walker stays ``tree.float_tensors`` (``tests/unit/capture/test_floats.py`` holds
them equal).

Why: at the default level a hook's arguments are walked on every call, and the general walker's
``isinstance`` chain and per-object dataclass check were a sixth of a watched forward's fixed cost.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..tree import _LEAVES, MAX_DEPTH, float_tensors

_TENSOR = torch.Tensor
_PARAMETER = torch.nn.Parameter
_SKIP = frozenset({type(None), bool, int, float, str, bytes, torch.dtype, torch.device})  # never hold tensors
_KINDS: dict[type, int] = {}  # type -> how tree.float_tensors walks one (see _kind)


def float_items(obj: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """``tree.float_tensors(obj, prefix)``."""
    out: list[tuple[str, torch.Tensor]] = []
    _walk(obj, prefix, 0, out)
    return out


_ARG_LABELS = tuple(f"args[{i}]" for i in range(16))


def call_items(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """``float_items(args, "args") + float_items(kwargs)``: what a pre-hook sees, in one pass."""
    out: list[tuple[str, torch.Tensor]] = []
    for i, v in enumerate(args):
        vt = type(v)
        if vt is _TENSOR or vt is _PARAMETER:
            if v.is_floating_point() and not v.is_meta:
                out.append((_ARG_LABELS[i] if i < 16 else f"args[{i}]", v))
        elif vt not in _SKIP:
            _walk(v, f"args[{i}]", 1, out)
    for k, v in kwargs.items():
        vt = type(v)
        if vt is _TENSOR or vt is _PARAMETER:
            if v.is_floating_point() and not v.is_meta:
                out.append((str(k) or "out", v))
        elif vt not in _SKIP:
            _walk(v, str(k), 1, out)
    return out


_SKIP_KIND, _SEQUENCE, _MAPPING, _GENERAL = range(4)


def _kind(tp: type) -> int:
    """How ``tree.float_tensors`` treats an object of type ``tp`` that is not a plain tensor, in its
    own order of checks: tensor subclasses and dataclasses by the general walker, dict subclasses
    (``ModelOutput``) as mappings, list and tuple subclasses (named tuples) as sequences, the rest
    skipped. A property of the type (``dataclasses.is_dataclass`` asks the class), so cached."""
    kind = _KINDS.get(tp)
    if kind is None:
        if issubclass(tp, torch.Tensor):
            kind = _GENERAL
        elif issubclass(tp, _LEAVES):
            kind = _SKIP_KIND
        elif issubclass(tp, dict):
            kind = _MAPPING
        elif issubclass(tp, (list, tuple)):
            kind = _SEQUENCE
        else:
            kind = _GENERAL if dataclasses.is_dataclass(tp) else _SKIP_KIND
        _KINDS[tp] = kind
    return kind


def _walk(obj: Any, prefix: str, depth: int, out: list[tuple[str, torch.Tensor]]) -> None:
    tp = type(obj)
    if tp is _TENSOR or tp is _PARAMETER:  # plain tensors: no DTensor shard to take
        if obj.is_floating_point() and not obj.is_meta:
            out.append((prefix or "out", obj))
        return
    if tp in _SKIP:
        return
    if depth > MAX_DEPTH:
        if isinstance(obj, torch.Tensor):  # a subclass deeper than the limit is still read
            out += float_tensors(obj, prefix, depth)
        return
    kind = _SEQUENCE if tp is tuple or tp is list else _MAPPING if tp is dict else _kind(tp)
    if kind == _SEQUENCE:
        for i, v in enumerate(obj):
            vt = type(v)
            if vt is _TENSOR or vt is _PARAMETER:  # inline: most elements are plain tensors
                if v.is_floating_point() and not v.is_meta:
                    out.append((f"{prefix}[{i}]", v))
            elif vt not in _SKIP:
                _walk(v, f"{prefix}[{i}]", depth + 1, out)
    elif kind == _MAPPING:
        for k, v in obj.items():
            label = f"{prefix}.{k}" if prefix else str(k)
            vt = type(v)
            if vt is _TENSOR or vt is _PARAMETER:
                if v.is_floating_point() and not v.is_meta:
                    out.append((label or "out", v))
            elif vt not in _SKIP:
                _walk(v, label, depth + 1, out)
    elif kind == _GENERAL:
        out += float_tensors(obj, prefix, depth)
