"""``nan_hunter.watch`` on models that run under torch.compile (docs/contract.md, "torch.compile").

Both orders — ``watch(torch.compile(m))`` and ``torch.compile(m)`` then ``watch(m)`` — give
eager's answer (leaf module, aten op, no ``_orig_mod.`` prefix) with no false notes, one graph
for repeated identical calls (no recompiles), outputs unchanged, ``fullgraph=True`` unbroken.
Most tests use the aot_eager backend (dynamo and AOT tracing, no C++ build); one uses inductor.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nan_hunter


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _model() -> Net:
    """blocks.1.fc overflows fp16 (+inf from its addmm) for the input below."""
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():
        m.blocks[1].fc.weight.mul_(1e4)
    return m.half()


X = (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)) * 10).half()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values, NaN where NaN (the outputs hold the fault)."""
    return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _where(r) -> tuple:
    f = r.first_nonfinite
    return f.module, f.module_type, f.op, f.kind, f.role, f.input_index


def _eager_answer(level: str = "blocks") -> tuple:
    m = _model()
    with torch.no_grad(), nan_hunter.watch(m, level=level) as w:
        m(X)
    return _where(w.report())


def _run(order: str, level: str = "blocks", n: int = 5, **compile_kw):
    m = _model()
    with torch.no_grad():
        plain = torch.compile(_model(), **compile_kw)(X)  # a separate model: the unwatched program
        cm = torch.compile(m, **compile_kw)
        target = cm if order == "wrap" else m
        with nan_hunter.watch(target, level=level) as w:
            outs = [cm(X) for _ in range(n)]
    return w, outs, plain


@pytest.mark.parametrize("level", ["blocks", "modules"])
@pytest.mark.parametrize("order", ["wrap", "after"])
def test_both_orders_give_eagers_answer(order, level, fresh_dynamo):
    w, outs, plain = _run(order, level, backend="aot_eager")
    r = w.report()
    assert (
        _where(r)
        == _eager_answer(level)
        == ("blocks.1.fc", "Linear", "aten.addmm.default", "posinf", "producer", 0)
    )
    assert all(_same(o, plain) for o in outs)  # the compiled program's outputs are unchanged
    assert not any("_orig_mod" in c["module"] for c in r.calls)
    assert not any("changed in place" in n for n in r.notes), r.notes
    assert any("ran under torch.compile" in n and "eagerly" in n for n in r.notes), r.notes
    assert r.failed_inputs == [0, 1, 2, 3, 4]
    counters = fresh_dynamo
    assert sum(counters["recompiles"].values()) == 0
    assert counters["frames"]["total"] <= 2  # one frame per model: hooks split nothing, guard on nothing
    assert (
        counters["stats"]["unique_graphs"] <= 2
    )  # the unwatched model's graph (shared here) and the watched one's


@pytest.mark.parametrize("order", ["wrap", "after"])
def test_fullgraph_program_is_not_broken(order):
    w, outs, plain = _run(order, n=2, backend="aot_eager", fullgraph=True)
    assert all(_same(o, plain) for o in outs)
    assert _where(w.report())[:3] == ("blocks.1.fc", "Linear", "aten.addmm.default")


def test_compiled_submodule_is_named_and_located_eagerly():
    m = _model()
    m.blocks[1] = torch.compile(m.blocks[1], backend="aot_eager")
    with torch.no_grad(), nan_hunter.watch(m, level="modules") as w:
        m(X)
    r = w.report()
    assert _where(r)[:3] == ("blocks.1.fc", "Linear", "aten.addmm.default")
    assert not any("_orig_mod" in c["module"] for c in r.calls)


def test_hooks_are_removed_and_the_model_compiles_clean_after(fresh_dynamo):
    m = _model()
    cm = torch.compile(m, backend="aot_eager")
    with torch.no_grad():
        with nan_hunter.watch(m):
            cm(X)
        assert sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules()) == 0
        before = fresh_dynamo["stats"]["unique_graphs"]
        for _ in range(3):
            cm(X)
    assert fresh_dynamo["stats"]["unique_graphs"] <= before + 1  # at most one recompile without the hooks


@pytest.mark.slow
def test_inductor_both_orders():
    answers = {order: _where(_run(order, n=3)[0].report()) for order in ("wrap", "after")}
    assert answers["wrap"] == answers["after"] == _eager_answer()


@pytest.mark.slow
def test_nan_only_in_the_compiled_run_is_said(tmp_path):
    """The torchtitan miniature's variant under watch: the compiled forward is NaN, the eager
    re-run is finite, and the report says the value exists only in the compiled run."""
    import importlib.util
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    d = Path(__file__).resolve().parents[2] / "examples/incidents/compile_rmsnorm_fp8"
    spec = importlib.util.spec_from_file_location("compile_rmsnorm_fp8_model", d / "model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dynamo imports the globals' module by name
    spec.loader.exec_module(mod)
    m = mod.build_nan()
    m.load_state_dict(load_file(str(d / "model.safetensors")))
    m = m.to(torch.bfloat16).eval()
    x = load_file(str(d / "inputs_nan.safetensors"))["x"]
    cm = torch.compile(m)
    with torch.no_grad(), nan_hunter.watch(cm) as w:
        out = cm(x)
    assert not bool(torch.isfinite(out.float()).all())
    r = w.report()
    assert r.first_nonfinite is not None and r.first_nonfinite.module == ""  # only the root was seen
    assert any("exists only in the compiled run" in n for n in r.notes), r.notes
