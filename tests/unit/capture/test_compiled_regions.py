"""capture/compiled_regions.py: a model under ``torch.compile`` keeps its eager names (``_orig_mod``
never in a name, a compiled submodule once, as its wrapper), hooks that run outside the compiled
program, and a context in which everything compiled runs eagerly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.compiled_regions import (
    ORIG,
    compiling,
    eager_name,
    eager_named_modules,
    eager_only,
    is_wrapper,
    outside_compile,
    root_outside_compile,
    unwrap,
)


@pytest.mark.parametrize(
    "name, eager",
    [
        ("", ""),
        ("layers.0", "layers.0"),
        ("_orig_mod.layers.0", "layers.0"),
        ("_orig_mod", ""),
        ("a._orig_mod.b._orig_mod", "a.b"),
    ],
)
def test_eager_name(name, eager):
    assert eager_name(name) == eager


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))


def test_wrappers_unwrap_and_names_stay_eager():
    m = _model()
    c = torch.compile(m, backend="eager")
    assert is_wrapper(c) and not is_wrapper(m) and unwrap(c) is m and unwrap(m) is m
    assert [n for n, _ in eager_named_modules(c)] == [n for n, _ in m.named_modules()]
    m2 = _model()
    m2[2] = torch.compile(m2[2], backend="eager")  # a compiled submodule: once, as its wrapper
    names = eager_named_modules(m2)
    assert [n for n, _ in names] == ["", "0", "1", "2"] and is_wrapper(dict(names)["2"])
    assert all(ORIG not in n for n, _ in names)


def test_outside_compile_and_compiling():
    """A root hook on the compiled wrapper, wrapped once dynamo is loaded, runs eagerly around the
    compiled call (no graph break, also with fullgraph=True); an inner module's hook is traced, and
    sees ``compiling()`` (capture hooks then do nothing). Before dynamo is loaded the hook is
    returned as it is."""
    import sys

    def plain(*a):
        return None

    if "torch._dynamo" not in sys.modules:
        assert outside_compile(plain) is plain
    import torch._dynamo  # noqa: F401

    root_seen, inner_seen = [], []
    m = _model()
    c = torch.compile(m, backend="eager", fullgraph=True)
    c.register_forward_hook(outside_compile(lambda mod, args, out: root_seen.append(compiling())))
    m[0].register_forward_hook(lambda mod, args, out: inner_seen.append(compiling()))
    x = torch.ones(1, 2)
    assert torch.equal(c(x), m(x))
    assert root_seen == [False] and inner_seen == [True, False]  # traced once, then the eager call


def test_eager_only_runs_compiled_code_eagerly():
    calls = []

    def f(x):
        calls.append(compiling())
        return x + 1

    cf = torch.compile(f, backend="eager")
    with eager_only():
        assert cf(torch.ones(1)).item() == 2.0
    assert calls == [False]


def _seen_by_a_root_hook(seen: list) -> tuple:
    def nested(out: torch.Tensor) -> None:  # what a root hook calls (the recorder's bookkeeping)
        seen.append(compiling())

    def hook(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
        nested(out)

    return hook, nested


@pytest.mark.parametrize("how", ["outer_function", "module_compile"])
def test_a_root_hook_marked_once_runs_eagerly_with_no_wrapper(how):
    """``root_outside_compile`` returns the hook itself (no wrapper call per step) and it still runs
    eagerly around compiled code: under ``model.compile()`` and inside a compiled function that
    calls the model (dynamo breaks the graph at it), with ``compiling()`` False; nothing it calls
    is compiled (no dynamo cache entry for its callee), as with ``outside_compile``'s wrapper."""
    import torch._dynamo  # noqa: F401
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    seen: list = []
    hook, nested = _seen_by_a_root_hook(seen)
    assert root_outside_compile(hook) is hook
    m = _model()
    m.register_forward_hook(hook)
    x = torch.ones(1, 2)
    want = m(x)
    seen.clear()
    if how == "module_compile":
        m.compile(backend="eager")
        outs = [m(x) for _ in range(3)]
    else:
        step = torch.compile(lambda x: m(x) * 1, backend="eager")
        outs = [step(x) for _ in range(3)]
    assert all(torch.equal(o, want) for o in outs)
    assert seen == [False, False, False]  # every call ran eagerly, outside the trace
    assert _debug_get_cache_entry_list(nested.__code__) == []  # never compiled
