"""What a root forward was called with, kept so that ``report()`` can re-run it later.

``Snapshot.of(args, kwargs)`` copies the *structure* with ``tree.map_tensors`` (tuples, dicts,
``ModelOutput``, and plain objects such as a transformers ``DynamicCache`` and its layers) and
keeps tensors by reference,
with their version counters: cheap enough for every forward, and immune to a later forward
growing the same cache object (``DynamicCache.update`` rebinds its layers' tensors). ``pin()``
turns the references into copies once the forward is known to be the one a report needs.
``rerun()`` gives a fresh copy to run from, so a re-run never touches the user's objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..tree import map_tensors

_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter, type(None), bool, int, float, str, torch.dtype, torch.device})


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
        values = (*args, *kwargs.values())
        for v in values:
            if type(v) not in _PLAIN:
                return cls._of(args, kwargs)
        # tensors and scalars only (a training batch, a forward without a cache): nothing to copy
        vs: list[tuple[torch.Tensor, int]] = []
        kept: set[int] = set()
        for v in values:
            tp = type(v)
            if (tp is torch.Tensor or tp is torch.nn.Parameter) and id(v) not in kept:
                kept.add(id(v))
                if not v.is_inference():  # inference tensors have no version counter
                    vs.append((v, v._version))
        return cls(tuple(args), dict(kwargs), vs)

    @classmethod
    def _of(cls, args: tuple, kwargs: dict) -> Snapshot:
        vs: list[tuple[torch.Tensor, int]] = []
        kept: set[int] = set()

        def keep(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in kept:
                kept.add(id(t))
                if not t.is_inference():  # inference tensors have no version counter
                    vs.append((t, t._version))
            return t

        # plain tensors and scalars are kept as they are (every root call: kept cheap); anything
        # else (a KV cache, nested containers) goes through one map_tensors walk, so objects
        # shared among them stay shared
        odd = [v for v in (*args, *kwargs.values()) if type(v) not in _PLAIN]
        mapped = iter(map_tensors(odd, keep)) if odd else None

        def put(v: Any) -> Any:
            tp = type(v)
            if tp is torch.Tensor or tp is torch.nn.Parameter:
                return keep(v)
            return v if tp in _PLAIN else next(mapped)

        a = tuple(put(v) for v in args)
        k = {key: put(v) for key, v in kwargs.items()}
        return cls(a, k, vs)

    def pin(self) -> None:
        """Replace the references by copies (of the values as the forward started, when no one
        changed them in place since; otherwise as they are now, counted in ``changed``)."""
        if self.pinned:
            return
        self.changed = sum(1 for t, v in self.versions if t._version != v)
        self.args, self.kwargs = map_tensors((self.args, self.kwargs), _clone)
        self.versions = []
        self.pinned = True

    def changed_since(self) -> int:
        """Tensors changed in place since the forward started (0 once pinned: see ``changed``)."""
        return self.changed if self.pinned else sum(1 for t, v in self.versions if t._version != v)

    def rerun(self) -> tuple[tuple, dict]:
        """A fresh copy of (args, kwargs) to run from."""
        return map_tensors((self.args, self.kwargs), _clone)
