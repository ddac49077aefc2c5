"""The uninitialised-read oracle: does a run's non-finite result follow the fill of its fresh
allocations? Derived without nanhunter (it shares no code with it;
``tests/unit/test_oracle_independent.py``).

``fill_cause(fn)`` runs ``fn`` twice under its own ``TorchDispatchMode``, the floats of every
``empty``-family allocation filled with NaN, then with 0 (integers with 0 both times), from the
same RNG state. NaN run non-finite and zero run finite: ``"uninitialised_read"``, and the reader is
the first op, in run order, that computes (not an allocation, a view, a copy or an in-place write)
and whose output is non-finite in the NaN run and finite in the zero run. Otherwise ``None``."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

FRESH = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
MOVES = {
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "expand",
    "slice",
    "select",
    "narrow",
    "unsqueeze",
    "squeeze",
    "as_strided",
    "alias",
    "detach",
    "clone",
    "contiguous",
    "_to_copy",
    "copy",
    "cat",
    "stack",
    "index_select",
    "gather",
    "split",
    "split_with_sizes",
    "unbind",
    "lift_fresh",
}


def _bad(out: Any) -> bool:
    flat, _ = tree_flatten(out)
    return any(
        isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
        for t in flat
    )


class _Fill(TorchDispatchMode):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value
        self.ops: list[tuple[str, bool]] = []  # (op, output non-finite) in run order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._opname
        if name in FRESH:
            with torch.no_grad():
                out.fill_(self.value if out.is_floating_point() else 0)
            return out
        self.ops.append((name, _bad(out)))
        return out


def _run(fn, value: float) -> tuple[list[tuple[str, bool]], bool]:
    mode = _Fill(value)
    with torch.random.fork_rng(devices=[]), torch.no_grad(), mode:
        out = fn()
    return mode.ops, _bad(out)


def fill_cause(fn) -> tuple[str | None, str | None]:
    """(``"uninitialised_read"``, the reader's op name) when the fault follows the fill, else (None, None)."""
    nan_ops, nan_bad = _run(fn, math.nan)
    zero_ops, zero_bad = _run(fn, 0.0)
    if not nan_bad or zero_bad:
        return None, None
    for (name, bad), (_, bad0) in zip(nan_ops, zero_ops):
        if bad and not bad0 and name not in MOVES and not name.endswith("_"):
            return "uninitialised_read", name
    return "uninitialised_read", None
