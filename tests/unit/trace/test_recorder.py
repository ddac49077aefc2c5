"""TraceRecorder on small models: entries, producers through views, spread over re-runs, and
nothing changed in the user's outputs."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.trace.reader import read_trace
from nan_hunter.trace.recorder import TraceRecorder


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x):
        h = self.lin(x).view(2, 3, 6).transpose(0, 1)  # views pass the producer on
        return self.norm(h.transpose(0, 1).reshape(-1, 6) + x)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(Block(), nn.GELU(), nn.Linear(6, 2))


def test_outputs_are_bitwise_unchanged_and_hooks_removed(tmp_path):
    m = _model()
    x = torch.randn(6, 6)
    with torch.no_grad():
        plain = m(x)
        for level in ("modules", "ops"):
            with TraceRecorder(m, tmp_path / f"{level}.jsonl", level=level):
                traced = m(x)
            assert torch.equal(plain, traced)
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())


def test_module_level_entries_in_completion_order_with_inputs(tmp_path):
    m = _model()
    x = torch.randn(6, 6)
    with TraceRecorder(m, tmp_path / "t.jsonl"), torch.no_grad():
        out = m(x)
    t = read_trace(tmp_path / "t.jsonl")
    assert [e.module for e in t.entries] == ["0.lin", "0.norm", "0", "1", "2", ""]
    root = t.entries[-1]
    assert root.stats.absmax == float(out.abs().max()) and root.input.absmax == float(x.abs().max())
    assert t.entries[2].stats.hash == t.entries[1].stats.hash  # the block returns its norm's output
    assert t.header.model["modules"] == ["", "0", "0.lin", "0.norm", "1", "2"]
    assert t.header.env["device"] == "cpu" and len(t.header.inputs) == 1


def test_op_level_producers_through_views(tmp_path):
    m = _model()
    with TraceRecorder(m, tmp_path / "t.jsonl", level="ops"), torch.no_grad():
        m(torch.randn(6, 6))
    t = read_trace(tmp_path / "t.jsonl")
    ops = [(e.module, e.op.split(".")[1]) for e in t.entries]
    assert ops[0] == ("0.lin", "addmm")
    assert not any(op in ("view", "transpose", "t", "_unsafe_view", "reshape", "clone") for _, op in ops)
    add = next(e for e in t.entries if e.module == "0" and e.op == "aten.add.Tensor")
    assert add.producers[0] == 0  # the linear's output, through view/transpose/reshape
    assert add.producers[1] is None  # the model's input
    ln = next(e for e in t.entries if e.module == "0.norm")
    assert ln.producers[0] == add.index


class Noisy(nn.Module):
    """Adds a different tiny amount on every call: a stand-in for a nondeterministic kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * (1 + 1e-4 * self.calls)


def test_repeat_stores_the_run_to_run_spread(tmp_path):
    m = nn.Sequential(nn.Linear(4, 4), Noisy(), nn.ReLU())
    x = torch.randn(3, 4)
    rec = TraceRecorder(m, tmp_path / "t.jsonl", repeat=3)
    with rec, torch.no_grad():
        with rec.input(0):
            for r in range(3):
                with rec.run(r):
                    m(x)
    t = read_trace(tmp_path / "t.jsonl")
    assert t.header.repeat == 3 and len(t.entries) == 4  # the first run's entries only
    spread = {e.module: e.spread for e in t.entries}
    assert spread["0"] == 0.0
    assert 1.5e-4 < spread["1"] < 2.5e-4  # run 3 against run 1: (1 + 3e-4) / (1 + 1e-4) - 1


def test_report_reruns_are_not_recorded_while_paused(tmp_path):
    m = _model()
    paused = {"on": False}
    with TraceRecorder(m, tmp_path / "t.jsonl", paused=lambda: paused["on"]), torch.no_grad():
        m(torch.randn(6, 6))
        paused["on"] = True
        m(torch.randn(6, 6))
    assert len(read_trace(tmp_path / "t.jsonl").entries) == 6


def test_ops_of_another_captures_statistics_are_not_traced(tmp_path):
    """watch(level="modules", trace_level="ops"): the watch's hooks measure with torch ops; the
    trace keeps the model's ops only."""
    import nan_hunter

    m = _model()
    x = torch.randn(6, 6)
    with TraceRecorder(m, tmp_path / "alone.jsonl", level="ops"), torch.no_grad():
        m(x)
    with (
        nan_hunter.watch(m, level="modules", trace=str(tmp_path / "watched.jsonl"), trace_level="ops"),
        torch.no_grad(),
    ):
        m(x)
    alone = [(e.module, e.op) for e in read_trace(tmp_path / "alone.jsonl").entries]
    watched = [(e.module, e.op) for e in read_trace(tmp_path / "watched.jsonl").entries]
    assert watched == alone


def test_watch_trace_has_one_step_per_root_call(tmp_path):
    import nan_hunter

    m = _model()
    with nan_hunter.watch(m, trace=str(tmp_path / "w.jsonl")) as w, torch.no_grad():
        for _ in range(3):
            m(torch.randn(6, 6))
    w.report()
    t = read_trace(tmp_path / "w.jsonl")
    assert sorted({e.step for e in t.entries}) == [0, 1, 2] and len(t.entries) == 18


def test_entries_name_their_input_dtypes_and_ops_mark_the_outputs(tmp_path):
    """``input_dtypes`` (what diff takes the tolerance from) on both levels; at level ops, the
    entry that made the root call's output (through the view after it) carries ``output``."""

    class Up(nn.Module):
        def forward(self, x):
            return (x.float() * 2).view(-1)

    m = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16), Up())
    with torch.no_grad():
        for level in ("modules", "ops"):
            with TraceRecorder(m, tmp_path / f"{level}.jsonl", level=level):
                m(torch.randn(2, 4, dtype=torch.bfloat16))
    mods = {e.module: e for e in read_trace(tmp_path / "modules.jsonl").entries}
    assert mods["1"].input_dtypes == ("bf16",) and mods["1"].dtype == "fp32" and not mods[""].output
    ops = read_trace(tmp_path / "ops.jsonl").entries
    cast = next(e for e in ops if e.op == "aten._to_copy.default")
    assert cast.input_dtypes == ("bf16",) and cast.dtype == "fp32"
    assert [e.op for e in ops if e.output] == ["aten.mul.Tensor"]


def test_a_compiled_models_trace_records_its_module_boundaries(tmp_path):
    """With ``compile_backend`` (``scan --compile --trace``), every module call of an eager run is
    an entry, computed by the module compiled alone on eager's inputs; the root is the compiled
    call itself. Without it (a watch of a compiled model), the root only."""
    m = _model()
    x = torch.randn(6, 6)
    with torch.no_grad():
        for backend, want in (("eager", ["0.lin", "0.norm", "0", "1", "2", ""]), (None, [""])):
            compiled = torch.compile(m, backend="eager")
            with TraceRecorder(compiled, tmp_path / f"{backend}.jsonl", compile_backend=backend):
                out = compiled(x)
            t = read_trace(tmp_path / f"{backend}.jsonl")
            assert [e.module for e in t.entries] == want
            assert t.entries[-1].stats.absmax == float(out.abs().max())
    torch._dynamo.reset()
