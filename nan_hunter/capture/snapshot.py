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
from collections.abc import Collection, Iterator
from typing import Any

import torch

from ..tree import map_tensors

_PLAIN = frozenset(
    {torch.Tensor, torch.nn.Parameter, type(None), bool, int, float, str, torch.dtype, torch.device}
)


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


_UNSEEN: Any = object()
#: (keywords, their types) -> the keywords holding a KV cache, or None when an argument is neither
#: a plain value nor a cache: a decode loop calls with the same shape every step, so it is found once
_CACHE_KEYS: dict[tuple[tuple[str, ...], tuple[type, ...]], tuple[str, ...] | None] = {}
_MAX_SHAPES = 256  # past that, shapes are no longer remembered (a caller that varies its keywords)


def _cache_keys(kwargs: dict, types: tuple[type, ...]) -> tuple[str, ...] | None:
    if len(_CACHE_KEYS) >= _MAX_SHAPES:
        _CACHE_KEYS.clear()
    keys = []
    for k, tp in zip(kwargs, types):
        if tp in _PLAIN:
            continue
        if not (callable(getattr(tp, "get_seq_length", None)) and callable(getattr(tp, "crop", None))):
            return None
        keys.append(k)
    return tuple(keys)


@dataclasses.dataclass
class Snapshot:
    """A root forward's arguments: structure copied, tensors by reference (or, pinned, copies)."""

    args: tuple
    kwargs: dict
    versions: list[tuple[torch.Tensor, int]]
    pinned: bool = False
    changed: int = 0  # tensors changed in place between the forward's start and pin()

    @classmethod
    def of(cls, args: tuple, kwargs: dict, without: Collection[str] = ()) -> Snapshot:
        """The snapshot of a forward's arguments; keywords named in ``without`` are not kept (nor
        walked: a continuous-batching forward's paged cache, which a replay never reads)."""
        if without:
            kwargs = {k: v for k, v in kwargs.items() if k not in without}
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
        mapped: Iterator[Any] = iter(map_tensors(odd, keep) if odd else ())

        def put(v: Any) -> Any:
            tp = type(v)
            if tp is torch.Tensor or tp is torch.nn.Parameter:
                return keep(v)
            return v if tp in _PLAIN else next(mapped)

        a = tuple(put(v) for v in args)
        k = {key: put(v) for key, v in kwargs.items()}
        return cls(a, k, vs)

    @staticmethod
    def cache_lengths(args: tuple, kwargs: dict) -> dict[str, int] | None:
        """Keyword -> length of each KV cache among a forward's arguments (an object with
        ``get_seq_length`` and ``crop``: a transformers ``DynamicCache``), when every other argument
        is a plain tensor or scalar: then ``cropped`` can rebuild the inputs after the forward ran.
        None otherwise (take ``of`` before the forward)."""
        if args and not _PLAIN.issuperset(map(type, args)):
            return None
        types = tuple(map(type, kwargs.values()))
        shape = (tuple(kwargs), types)
        caches = _CACHE_KEYS.get(shape, _UNSEEN)
        if caches is _UNSEEN:
            caches = _CACHE_KEYS[shape] = _cache_keys(kwargs, types)
        if caches is None:
            return None
        return {k: kwargs[k].get_seq_length() for k in caches}

    @classmethod
    def cropped(cls, args: tuple, kwargs: dict, lengths: dict[str, int]) -> Snapshot:
        """A forward's inputs taken after it ran (pinned copies), each KV cache cropped back to the
        length it had when the forward started (``cache_lengths``): a decode step only appends to
        its cache. The sentinel takes it for the one failing step instead of ``of`` on every step."""
        snap = cls.of(args, kwargs)
        snap.pin()
        for k, n in lengths.items():
            cache = snap.kwargs[k]
            grown = cache.get_seq_length() - n
            if grown > 0:
                cache.crop(-grown)  # a negative count: the tokens to remove, in every transformers version
        return snap

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
