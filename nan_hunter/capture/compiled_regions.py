"""Watching a model that runs under ``torch.compile``: eager names, and hooks that never change
the compiled program.

Inside a compiled region dynamo traces module hooks into the graph, so a hook that measures
would split the graph, guard on its counters (a recompile per call) and read parameter
version counters as 0. Capture hooks therefore do nothing while dynamo traces
(``compiling()``): a compiled region is invisible from inside, and ``report()`` locates a
fault in it by re-running that forward eagerly (``eager_only()``) from its captured inputs.
The root call is seen from outside: the root's hooks run eagerly around the compiled call
(``outside_compile``; on the ``OptimizedModule`` wrapper when the watch was given one), with no
graph break, also under ``fullgraph=True``.

Names are those of the eager model: ``_orig_mod`` (the wrapper's attribute) is never part of a
module name, so ``watch(torch.compile(m))`` and ``watch(m)`` report the same names.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

ORIG = "_orig_mod"


def _wrapper_type() -> type | None:
    mod = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(mod, "OptimizedModule", None) if mod is not None else None


def is_wrapper(m: Any) -> bool:
    """Whether ``m`` is the ``OptimizedModule`` that ``torch.compile(module)`` returns."""
    cls = _wrapper_type()
    return cls is not None and isinstance(m, cls)


def unwrap(model: nn.Module) -> nn.Module:
    """The eager module behind any ``torch.compile`` wrappers."""
    while is_wrapper(model):
        model = getattr(model, ORIG)
    return model


def eager_name(name: str) -> str:
    """A dotted module name without the wrappers' ``_orig_mod`` segments."""
    return ".".join(p for p in name.split(".") if p != ORIG)


def eager_named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``named_modules()`` under eager names; a compiled submodule appears once, as its wrapper
    (whose hooks run outside its compiled region), never as its ``_orig_mod``."""
    return [(eager_name(n), m) for n, m in model.named_modules() if n.split(".")[-1] != ORIG]


def outside_compile(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` made to run eagerly even when dynamo traces its caller (``torch._dynamo.disable``).
    Only once dynamo is loaded: importing it takes seconds, and without it nothing is compiled."""
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo.disable(hook) if dynamo is not None else hook


def root_outside_compile(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``outside_compile`` at no cost per call, for a function whose code object runs only as a
    root hook (the recorder's one root pre-hook and post-hook, every step): instead of a wrapper
    that switches dynamo's frame callback off and on around every call (~60 bytecodes and two C
    calls each time), the function is marked once as ``torch.compiler.disable`` marks its wrapper
    (dynamo breaks the graph at it and calls it eagerly) and its code object is given dynamo's
    frame strategy "skip this frame and every frame it calls" (what that wrapper's callback switch
    achieves). Outside dynamo nothing runs per call. Where torch lacks that API: ``outside_compile``.
    The strategy belongs to the code object: a ``def`` whose functions also hook inner modules
    (traced, and asking ``compiling()``) must not be passed here."""
    if sys.modules.get("torch._dynamo") is None:
        return hook
    frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    try:
        skip = frames._FrameAction.SKIP  # type: ignore[union-attr]
        frames.set_code_exec_strategy(hook.__code__, frames._FrameExecStrategy(skip, skip))  # type: ignore[union-attr]
    except (AttributeError, TypeError):  # a torch without frame strategies
        return outside_compile(hook)
    hook._torchdynamo_disable = True  # type: ignore[attr-defined]
    hook._torchdynamo_disable_msg = "nan_hunter's root hook runs eagerly around the compiled call"  # type: ignore[attr-defined]
    return hook


#: True while dynamo traces (a hook then must not measure: see the module docstring). The torch
#: function itself, not a wrapper around it: every hook asks, on every call.
compiling = torch.compiler.is_compiling


@contextlib.contextmanager
def eager_only() -> Iterator[None]:
    """Everything compiled runs eagerly inside (a re-run that capture can see into)."""
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:  # torch < 2.6: compiled wrappers would still run compiled
        yield
        return
    with stance("force_eager"):
        yield
