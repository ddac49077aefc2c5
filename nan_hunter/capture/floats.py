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

from ..tree import LEAF_TYPES, MAX_DEPTH, float_tensors

_TENSOR = torch.Tensor
_PARAMETER = torch.nn.Parameter
_SKIP = frozenset({type(None), bool, int, float, str, bytes, torch.dtype, torch.device})  # never hold tensors
_PLAIN, _SKIP_KIND, _SEQUENCE, _MAPPING, _GENERAL = range(5)
#: type -> how tree.float_tensors walks an object of it (see _kind); one lookup per value a hook sees
_KINDS: dict[type, int] = {
    _TENSOR: _PLAIN,
    _PARAMETER: _PLAIN,
    tuple: _SEQUENCE,
    list: _SEQUENCE,
    dict: _MAPPING,
    **dict.fromkeys(_SKIP, _SKIP_KIND),
}


def float_items(obj: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """``tree.float_tensors(obj, prefix)``."""
    out: list[tuple[str, torch.Tensor]] = []
    tp = type(obj)
    if tp is _TENSOR:  # what most modules return
        if obj.is_floating_point() and not obj.is_meta:
            out.append((prefix or "out", obj))
        return out
    _walk(obj, prefix, 0, out)
    return out


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The floating tensors of ``float_items(output)``, without their labels (the sentinel's one
    reduction per step needs none; a failing step takes ``float_items`` for its rows): a root's
    outputs are a tensor or a ``ModelOutput``/tuple/list of tensors, None and objects walked as
    ``float_items`` walks them (a KV cache: no tensor it reads; its type is looked up once)."""
    tp = type(output)
    if tp is _TENSOR:
        return [output] if output.is_floating_point() and not output.is_meta else []
    kind = _KINDS.get(tp)
    if kind is None:
        kind = _kind(tp)
    if kind == _MAPPING:
        values: Any = output.values()
    elif kind == _SEQUENCE:
        values = output
    else:
        return [t for _, t in float_items(output)]
    out: list[torch.Tensor] = []
    kinds = _KINDS
    for v in values:
        if type(v) is _TENSOR:
            if v.is_floating_point() and not v.is_meta:
                out.append(v)
        elif kinds.get(type(v)) != _SKIP_KIND:
            out += [t for _, t in float_items(v)]
    return out


_ARG_LABELS = tuple(f"args[{i}]" for i in range(16))


def call_items(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """``float_items(args, "args") + float_items(kwargs)``: what a pre-hook sees, in one pass."""
    out: list[tuple[str, torch.Tensor]] = []
    kinds = _KINDS
    for i, v in enumerate(args):
        kind = kinds.get(type(v))
        if kind == _PLAIN:
            if v.is_floating_point() and not v.is_meta:
                out.append((_ARG_LABELS[i] if i < 16 else f"args[{i}]", v))
        elif kind != _SKIP_KIND:
            _walk(v, f"args[{i}]", 1, out)
    for k, v in kwargs.items():
        kind = kinds.get(type(v))
        if kind == _PLAIN:
            if v.is_floating_point() and not v.is_meta:
                out.append((str(k) or "out", v))
        elif kind == _SEQUENCE:  # inline: a tuple of tensors (rotary position embeddings) on every layer
            label = str(k)
            for i, e in enumerate(v):
                if kinds.get(type(e)) == _PLAIN:
                    if e.is_floating_point() and not e.is_meta:
                        out.append((f"{label}[{i}]", e))
                else:
                    _walk(e, f"{label}[{i}]", 2, out)
        elif kind != _SKIP_KIND:
            _walk(v, str(k), 1, out)
    return out


def _kind(tp: type) -> int:
    """How ``tree.float_tensors`` treats an object of type ``tp`` that is not a plain tensor, in its
    own order of checks: tensor subclasses and dataclasses by the general walker, dict subclasses
    (``ModelOutput``) as mappings, list and tuple subclasses (named tuples) as sequences, the rest
    skipped. A property of the type (``dataclasses.is_dataclass`` asks the class), so cached."""
    kind = _KINDS.get(tp)
    if kind is None:
        if issubclass(tp, torch.Tensor):
            kind = _GENERAL
        elif issubclass(tp, LEAF_TYPES):
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
    kind = _KINDS.get(tp)
    if kind == _PLAIN:  # plain tensors: no DTensor shard to take
        if obj.is_floating_point() and not obj.is_meta:
            out.append((prefix or "out", obj))
        return
    if kind == _SKIP_KIND:
        return
    if depth > MAX_DEPTH:
        if isinstance(obj, torch.Tensor):  # a subclass deeper than the limit is still read
            out += float_tensors(obj, prefix, depth)
        return
    if kind is None:
        kind = _kind(tp)
    if kind == _SEQUENCE:
        for i, v in enumerate(obj):
            if type(v) is _TENSOR:  # inline: most elements are plain tensors
                if v.is_floating_point() and not v.is_meta:
                    out.append((f"{prefix}[{i}]", v))
            else:
                _walk(v, f"{prefix}[{i}]", depth + 1, out)
    elif kind == _MAPPING:
        for k, v in obj.items():
            label = f"{prefix}.{k}" if prefix else str(k)
            if type(v) is _TENSOR:
                if v.is_floating_point() and not v.is_meta:
                    out.append((label or "out", v))
            else:
                _walk(v, label, depth + 1, out)
    elif kind == _GENERAL:
        out += float_tensors(obj, prefix, depth)
