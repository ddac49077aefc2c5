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
