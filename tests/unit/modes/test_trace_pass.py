"""``modes.trace_pass``: ``scan --trace``'s options checked once (``TraceOptions``), and the trace
written in the same pass as the capture (``trace_for`` observed by the harness's recorders,
``trace_note``): the file it leaves (entries per input, the header's inputs and mode), ``--repeat``'s
re-runs from the same RNG state with the capture paused, the note, and no file left behind when
the run fails."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from nan_hunter.config import default_config
from nan_hunter.dtypes import RunDtype
from nan_hunter.errors import BadInput
from nan_hunter.model.prepare import Prepared
from nan_hunter.modes.forward import ForwardMode
from nan_hunter.modes.harness import run_mode
from nan_hunter.modes.trace_pass import TRACE_LEVELS, TraceOptions, trace_for, trace_note
from nan_hunter.report import Report
from nan_hunter.trace.env import inputs_hash
from nan_hunter.trace.reader import read_trace


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.relu(self.lin(x))))


def _prepared(model: nn.Module, xs: list[torch.Tensor]) -> Prepared:
    return Prepared(
        None,
        model,
        None,
        "test",
        [{"x": x} for x in xs],
        [f"input {i}" for i in range(len(xs))],
        RunDtype.of("fp32"),
        torch.device("cpu"),
        default_config(),
    )


# --- TraceOptions ------------------------------------------------------------------------------------


def test_trace_options_accept_what_scan_takes():
    o = TraceOptions("t.jsonl")
    assert (o.level, o.repeat, o.compile) == ("modules", None, None)
    assert TraceOptions("t.jsonl", "ops", 3).repeat == 3
    assert TraceOptions("t.jsonl", "modules", None, "inductor").compile == "inductor"
    assert TRACE_LEVELS == ("modules", "ops")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"path": ""}, "not a usable file name"),
        ({"path": "a\0b"}, "not a usable file name"),
        ({"level": "blocks"}, "--trace-level 'blocks': use modules or ops"),
        ({"repeat": 1}, "--repeat 1: give the number of runs per input, at least 2"),
        ({"repeat": True}, "--repeat True"),
        ({"repeat": 2.5}, "--repeat 2.5"),
        ({"level": "ops", "compile": "inductor"}, "--trace-level ops with --compile"),
    ],
)
def test_trace_options_refuse_in_one_line(kw, words):
    args = {"path": "t.jsonl", **kw}
    with pytest.raises(BadInput) as ei:
        TraceOptions(**args)
    assert words in str(ei.value) and "\n" not in str(ei.value)


# --- the trace of the capture's pass -------------------------------------------------------------------


def write_trace(p: Prepared, mode: Any, opts: TraceOptions, command: list[str] | None = None) -> str:
    """What ``scan --trace`` does: the harness's one pass with the trace observing it; the note."""
    trace = trace_for(p, mode, opts, command)
    run_mode(p, mode, Report(), True, trace)
    return trace_note(trace, opts, len(p.batches))


def test_write_trace_records_every_input_and_returns_its_note(tmp_path):
    m = Net().eval()
    xs = [torch.randn(2, 4), torch.randn(3, 4)]
    p = _prepared(m, xs)
    path = tmp_path / "scan.jsonl"
    note = write_trace(p, ForwardMode(), TraceOptions(str(path)), command=["nanhunter", "scan", "x"])
    t = read_trace(path)
    assert note == f"trace written to {path}: {len(t.entries)} modules-level entries of 2 input(s)"
    assert len(t.entries) == 2 * 4  # one entry per module call: lin, drop, head and the root
    assert [e.module for e in t.entries if e.input_index == 0] == ["lin", "drop", "head", ""]
    assert {e.input_index for e in t.entries} == {0, 1}
    root = [e for e in t.entries if e.module == ""]
    with torch.no_grad():
        assert [r.stats.absmax for r in root] == [float(m(x).abs().max()) for x in xs]
    assert [i["index"] for i in t.header.inputs] == [0, 1]
    assert [i["label"] for i in t.header.inputs] == ["input 0", "input 1"]
    assert t.header.inputs[0]["hash"] == inputs_hash((), p.batches[0])
    assert t.header.raw["mode"] == "forward" and t.header.raw["command"] == ["nanhunter", "scan", "x"]
    assert t.header.env["dtype"] == "fp32" and t.header.level == "modules"


def test_the_traced_run_is_the_captured_run_one_pass(tmp_path):
    """The data set runs once: the trace observes the capture's own recorder (no second pass)."""
    seen: list[tuple[bool, Any]] = []

    class Spy(ForwardMode):
        def run_input(self, model: Any, kwargs: dict[str, Any], recorder: Any) -> list[Any]:
            seen.append((torch.is_grad_enabled(), recorder))
            return super().run_input(model, kwargs, recorder)

    m = Net().eval()
    path = tmp_path / "spy.jsonl"
    write_trace(_prepared(m, [torch.ones(1, 4), torch.ones(2, 4)]), Spy(), TraceOptions(str(path)))
    observed = [r for _, r in seen if r.observers]  # (a clean run's near-miss pass at level ops: no trace)
    assert (
        len(observed) == 2 and observed[0] is observed[1]
    )  # one run per input, under the capture's recorder
    assert observed[0].capturing and observed[0].level == "modules" and not any(g for g, _ in seen)
    assert len(read_trace(path).entries) == 2 * 4
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())  # detached


def test_op_level_entries_name_the_aten_ops(tmp_path):
    path = tmp_path / "ops.jsonl"
    note = write_trace(
        _prepared(Net().eval(), [torch.randn(2, 4)]), ForwardMode(), TraceOptions(str(path), "ops")
    )
    t = read_trace(path)
    assert "ops-level entries of 1 input(s)" in note and t.header.level == "ops"
    ops = [e.op for e in t.entries]
    assert "aten.addmm.default" in ops and "aten.relu.default" in ops


def test_repeat_re_runs_each_input_from_the_same_rng_state(tmp_path):
    m = Net().train()  # dropout draws a mask on every run
    path = tmp_path / "repeat.jsonl"
    p = _prepared(m, [torch.randn(4, 4), torch.randn(4, 4)])
    torch.manual_seed(3)
    run_mode(p, ForwardMode(), Report())
    untraced = torch.get_rng_state()
    torch.manual_seed(3)
    note = write_trace(p, ForwardMode(), TraceOptions(str(path), repeat=3))
    assert torch.equal(torch.get_rng_state(), untraced)  # the re-runs draw nothing the scan would not
    t = read_trace(path)
    assert t.header.repeat == 3
    assert note.endswith(", each run 3 times (spread per entry)")
    assert all(e.spread == 0.0 for e in t.entries)  # the same dropout masks on every re-run


class Wobbly(nn.Module):
    """Calls ``extra`` only on its first call: a re-run takes another path."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        return self.extra(y) if self.calls == 1 else y


def test_repeat_notes_entries_whose_re_run_took_another_path(tmp_path):
    path = tmp_path / "wobbly.jsonl"
    note = write_trace(
        _prepared(Wobbly().eval(), [torch.ones(1, 4)]), ForwardMode(), TraceOptions(str(path), repeat=2)
    )
    t = read_trace(path)
    assert "took another path on a re-run (spread null)" in note
    assert any(e.spread is None for e in t.entries)


def test_non_finite_values_are_traced_as_they_are(tmp_path):
    m = Net().eval()
    path = tmp_path / "nan.jsonl"
    write_trace(
        _prepared(m, [torch.ones(1, 4), torch.full((1, 4), float("nan"))]),
        ForwardMode(),
        TraceOptions(str(path)),
    )
    t = read_trace(path)
    root = {e.input_index: e for e in t.entries if e.module == ""}
    assert root[0].stats.kind is None and root[1].stats.kind == "nan"
    assert root[1].input.nan == 4


def test_a_run_that_fails_is_bad_input_and_leaves_no_file(tmp_path):
    path = tmp_path / "failed.jsonl"
    p = _prepared(Net().eval(), [torch.ones(1, 4), torch.ones(1, 7)])  # the second input is the wrong width
    with pytest.raises(BadInput) as ei:
        write_trace(p, ForwardMode(), TraceOptions(str(path)))
    msg = str(ei.value)
    assert msg.startswith("the model raised RuntimeError in ") and "\n" not in msg
    assert not path.exists()
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in p.model.modules())
