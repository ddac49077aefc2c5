"""Uninitialised reads told apart from arithmetic (contract v1.4 cause ``uninitialised_read``).

A failing region (a module call, from copies of its inputs) is run twice more under
``FreshFill``, a dispatch mode that fills the result of every fresh allocation (``aten.empty``,
``empty_like``, ``new_empty``, ``empty_strided``, …) before anything else sees it: once with NaN,
once with zeros. When the NaN-filled run is non-finite and the zero-filled run finite, the fault
follows the fill: the region read memory it never wrote (padding rows left as ``torch.empty``, a
stale KV block), and the op named is the first one that computed with that memory (a view, a copy
or a write into the allocation is not a read). Otherwise the fault is the arithmetic's, as before.

Why a dispatch mode rather than ``torch.use_deterministic_algorithms(True)`` with
``torch.utils.deterministic.fill_uninitialized_memory``: that fills with NaN only (no zero run to
compare), and only through a process-wide flag; the mode touches no global state. Both fill runs
start from the same RNG state, which is put back afterwards (``torch.random.fork_rng``).
Integer allocations are zero-filled in both runs, so the runs differ only in the floats.

The cost is on the failing path only: ``uninitialised_read`` is asked once per located forward
fault, and the zero run happens only when the NaN run allocated something and went non-finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..tree import detached_copy, float_tensors
from .ops import (
    ALLOCATIONS,
    VIEW_OPS,
    OpEvent,
    _counts,
    _float_tensors,
    _kind,
    _storage,
    operand_stats,
    user_source,
)

#: ops that move a value without computing with it: their result is as fresh as their operand
MOVES = VIEW_OPS | {
    "_to_copy",
    "to",
    "copy",
    "cat",
    "stack",
    "slice",
    "select",
    "narrow",
    "as_strided",
    "index_select",
    "gather",
    "repeat",
    "alias",
    "lift_fresh",
    "unsqueeze",
    "squeeze",
    "reshape",
    "flatten",
    "unflatten",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "expand_as",
    "constant_pad_nd",
    "unfold",
}


class FreshFill(TorchDispatchMode):
    """Fills every fresh allocation's floats with ``value`` (integers with 0) and, with a NaN fill,
    names the first op that computed with the fresh memory and gave a non-finite result
    (``reader``); ``first_allocation``: the first allocating op, named when nothing read it inside
    the region (the fresh values left the region as they were)."""

    def __init__(self, value: float, site: str | None = None) -> None:
        super().__init__()
        self.value = value
        self.site = site
        self.allocations = 0
        self.fresh: set[int] = set()  # storages holding fresh memory, or values moved from it
        self._alive: list[Any] = []  # those storages kept alive: a freed one's address could be reused
        self.reader: OpEvent | None = None
        self.first_allocation: OpEvent | None = None

    def _mark(self, out: Any) -> None:
        for t in (x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)):
            s = _storage(t)
            if s is not None:
                self.fresh.add(s)
                self._alive.append(t.untyped_storage())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._opname
        if name in ALLOCATIONS and isinstance(out, torch.Tensor):
            with torch.no_grad():
                out.fill_(self.value if out.is_floating_point() else 0)
            self.allocations += 1
            self._mark(out)
            if self.first_allocation is None:
                self.first_allocation = OpEvent(
                    str(func),
                    None,
                    0,
                    0,
                    0,
                    user_source(self.site),
                    [],
                    str(out.dtype).removeprefix("torch."),
                )
            return out
        if not self.fresh or self.reader is not None:
            return out
        flat = tree_flatten((args, kwargs))[0]
        touched = [x for x in flat if isinstance(x, torch.Tensor) and _storage(x) in self.fresh]
        if not touched:
            return out
        writes = name.endswith("_") or "out" in kwargs
        if name in MOVES or (writes and flat and _storage(flat[0]) in self.fresh):
            if not writes:
                self._mark(out)  # a view or copy of fresh memory is fresh memory
            return out
        outs = _float_tensors(out)
        if outs and math.isnan(self.value):
            nan, pos, neg = _counts(outs)
            if nan or pos or neg:
                operands = [s for s in (operand_stats(i, x) for i, x in enumerate(flat)) if s is not None]
                self.reader = OpEvent(
                    str(func),
                    _kind(nan, pos, neg),
                    nan,
                    pos,
                    neg,
                    user_source(self.site),
                    operands,
                    str(outs[0].dtype).removeprefix("torch."),
                    mechanism="uninitialised_read",
                )
        return out


@dataclass
class FillVerdict:
    """The two fill runs of a region: ``uninitialised`` when the NaN run is non-finite and the zero
    run finite; ``op``: the op that read the fresh memory (or the allocation, when the region
    returned it unread)."""

    allocations: int
    nan_fill_finite: bool
    zero_fill_finite: bool | None  # None: not run (nothing allocated, or the NaN run stayed finite)
    op: OpEvent | None

    @property
    def uninitialised(self) -> bool:
        return not self.nan_fill_finite and self.zero_fill_finite is True


def _finite(out: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for _, t in float_tensors(out))


def _filled_run(
    module: nn.Module, args: tuple, kwargs: dict, value: float, site: str | None
) -> tuple[FreshFill, bool]:
    devices = [d for d in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else []
    a, kw = detached_copy((args, kwargs))
    mode = FreshFill(value, site)
    with torch.random.fork_rng(devices=devices), torch.no_grad(), mode:
        out = module(*a, **kw)
    return mode, _finite(out)


def fill_verdict(module: nn.Module, args: tuple, kwargs: dict, site: str | None = None) -> FillVerdict | None:
    """Run ``module(*args, **kwargs)`` (copies) with fresh allocations NaN-filled, then, when that
    run allocated and went non-finite, zero-filled; None when the region cannot be run again."""
    try:
        nan_mode, nan_finite = _filled_run(module, args, kwargs, math.nan, site)
        if nan_mode.allocations == 0 or nan_finite:
            return FillVerdict(nan_mode.allocations, nan_finite, None, None)
        _, zero_finite = _filled_run(module, args, kwargs, 0.0, site)
    except Exception:  # noqa: BLE001 - a region that cannot be run again here (a custom kernel, a subclass)
        return None
    if not nan_finite and zero_finite:
        op = nan_mode.reader or nan_mode.first_allocation
        if op is not None:
            op.mechanism = "uninitialised_read"
            if op.kind is None:
                op.kind = "nan"
        return FillVerdict(nan_mode.allocations, False, True, op)
    return FillVerdict(nan_mode.allocations, nan_finite, zero_finite, None)
