"""``session.watcher.Watch`` (what ``nan_hunter.watch`` returns) on small real models: ``report()``
names the first module and op that produced a NaN (refined from level blocks by re-running the
failing forward), hooks come off on close and when the model raises, outputs are bitwise those of
the bare model, and a report leaves the user's RNG, modes, buffers and autocast as they were."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nan_hunter.capture.context import ForwardContext
from nan_hunter.errors import NonFiniteError
from nan_hunter.session.options import WatchOptions
from nan_hunter.session.watch_report import WATCH_CHECKPOINT, WatchReport
from nan_hunter.session.watcher import SessionListener, Watch


class LogShift(nn.Module):
    """log(x - shift): NaN wherever x < shift."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - self.shift)


class Block(nn.Module):
    def __init__(self, shift: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.log = LogShift(shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log(torch.sigmoid(self.lin(x)) + 10)  # in (10, 11): finite unless shift > 10


class Net(nn.Module):
    """Three blocks; ``bad`` (if any) takes log of a negative, so it is the first NaN."""

    def __init__(self, bad: int | None = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(20.0 if i == bad else 0.0) for i in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _watched(model: nn.Module, xs: list[torch.Tensor], **kw) -> Watch:
    w = Watch(model, **kw)
    with w, torch.no_grad():
        for x in xs:
            model(x)
    return w


# --- report() -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["blocks", "modules"])
def test_report_names_the_first_nan_producing_module_and_op(level):
    m = Net(bad=1).eval()
    w = _watched(m, [torch.randn(2, 4) for _ in range(2)], level=level)
    r = w.report()
    assert isinstance(r, WatchReport)
    f = r.first_nonfinite
    assert f is not None
    assert (f.module, f.module_type, f.role, f.kind) == ("layers.1.log", "LogShift", "producer", "nan")
    assert f.op == "aten.log.default" and f.input_index == 0
    assert r.failed_inputs == [0, 1] and r.n_forwards == 2
    assert r["first_nonfinite"]["module"] == "layers.1.log"
    assert r.as_report().mode == "watch" and r.as_report().checkpoint == WATCH_CHECKPOINT


def test_a_clean_run_reports_no_finding_and_its_module_table():
    m = Net(bad=None).eval()
    w = _watched(m, [torch.randn(2, 4)], level="modules")
    r = w.report()
    assert r.first_nonfinite is None and r.diagnosis is None and r.failed_inputs == []
    assert r.n_forwards == 1
    assert {row["module"] for row in r.calls} >= {"", "layers.0", "layers.0.lin", "head"}
    assert all(row["input_index"] == 0 for row in r.calls)
    assert r.run["dtype"] == "fp32"


def test_the_report_is_made_once_until_another_forward_runs():
    m = Net(bad=1).eval()
    w = Watch(m, level="modules")
    with w, torch.no_grad():
        m(torch.randn(2, 4))
        first = w.report()
        assert w.report().report is first.report  # nothing ran since: the same report
        m(torch.randn(2, 4))
        again = w.report()
    assert again.report is not first.report and again.n_forwards == 2


def test_report_re_runs_are_not_recorded_and_leave_the_users_state():
    m = Net(bad=1)
    m.train()
    m.layers[0].eval()
    w = Watch(m, level="blocks")
    with w, torch.no_grad():
        m(torch.randn(2, 4))
        torch.manual_seed(11)
        rng = torch.get_rng_state()
        modes = [mod.training for mod in m.modules()]
        params = [p.clone() for p in m.parameters()]
        r = w.report()  # re-runs the failing forward at finer levels, with the hooks paused
        assert torch.equal(torch.get_rng_state(), rng)
    assert r.first_nonfinite.module == "layers.1.log"
    assert w.n_forwards == 1 and not w.paused
    assert [mod.training for mod in m.modules()] == modes
    assert all(torch.equal(a, b) for a, b in zip(params, m.parameters()))


def test_report_inside_the_users_autocast_gives_it_back():
    m = Net(bad=1)
    w = Watch(m, level="modules")
    with w, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        m(torch.randn(2, 4))
        r = w.report()
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert r.first_nonfinite is not None and r.first_nonfinite.module == "layers.1.log"
    assert w.contexts[0].autocast == (("cpu", torch.bfloat16),)
    assert r.run["dtype"] == "bf16"  # the precision the forward computed in, not the fp32 parameters'


# --- hooks and outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["blocks", "modules", "ops"])
def test_outputs_are_bitwise_equal_with_and_without_the_watch(level):
    m = Net(bad=None).eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        plain = m(x)
        with Watch(m, level=level):
            watched = m(x)
    assert torch.equal(plain, watched)


def test_hooks_are_removed_on_close():
    m = Net()
    w = Watch(m, level="modules")
    with w:
        assert _hooks(m) > 0
    assert _hooks(m) == 0


def test_hooks_are_removed_when_the_model_raises():
    m = Net()
    with pytest.raises(RuntimeError), Watch(m, level="modules"):
        m(torch.randn(2, 5))  # wrong width
    assert _hooks(m) == 0


def test_hooks_are_removed_when_on_fault_raise_raises():
    m = Net(bad=1)
    with pytest.raises(NonFiniteError) as ei, torch.no_grad(), Watch(m, level="modules", on_fault="raise"):
        m(torch.randn(2, 4))
    assert _hooks(m) == 0
    assert ei.value.report.first_nonfinite.module == "layers.1.log"


# --- what a watch keeps and re-runs -----------------------------------------------------------------


def test_each_forwards_context_is_kept():
    m = Net(bad=None)
    w = Watch(m, level="blocks")
    with w:
        with torch.no_grad():
            m(torch.randn(2, 4))
        m(torch.randn(2, 4))
    assert isinstance(w.listener, SessionListener) and w.listener.model is m
    assert set(w.contexts) == {0, 1}
    assert isinstance(w.contexts[0], ForwardContext)
    assert w.contexts[0].grad is False and w.contexts[1].grad is True


def test_step_forward_re_runs_the_failing_forward_from_copies_of_its_inputs():
    m = nn.Sequential(nn.Linear(4, 4), LogShift(0.0))  # NaN where the linear's output is negative
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(4))
        m[0].bias.zero_()
    good, bad = torch.ones(1, 4), torch.tensor([[1.0, -1.0, 2.0, -3.0]])
    w = Watch(m, level="modules", retain=2)
    with w, torch.no_grad():
        m(good)
        out = m(bad)
    assert w.first_failed == 1
    rerun = w.step_forward(1)
    assert rerun is not None
    with torch.no_grad():
        again = rerun()
    torch.testing.assert_close(again, out, rtol=0, atol=0, equal_nan=True)
    bad.fill_(5.0)  # the user's tensor changes afterwards: the re-run used a copy
    with torch.no_grad():
        torch.testing.assert_close(rerun(), out, rtol=0, atol=0, equal_nan=True)
    assert w.step_forward(0) is None  # a clean forward on a host sink: its inputs were not kept
    assert w.step_forward(5) is None  # never ran


def test_state_kept_restores_what_a_re_run_changes():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    w = Watch(m)
    before = m[1].running_mean.clone()
    with w.state_kept():
        m.train()
        m(torch.randn(8, 4) + 5)
    assert not m.training and torch.equal(m[1].running_mean, before)


def test_on_fault_stop_sets_should_stop():
    m = Net(bad=1)
    w = Watch(m, level="modules", on_fault="stop")
    assert not w.should_stop
    with w, torch.no_grad():
        m(torch.randn(2, 4))
    assert w.should_stop


def test_options_given_as_an_object_or_as_keywords_are_the_same():
    a = Watch(Net(), WatchOptions(level="modules", retain=2))
    b = Watch(Net(), level="modules", retain=2)
    assert a.options == b.options and a.level == b.level == "modules" and a.retain == 2
    with pytest.raises(ValueError, match="level must be one of"):
        Watch(Net(), level="everything")


def test_a_trace_is_written_beside_the_capture(tmp_path):
    from nan_hunter.trace.reader import read_trace

    m = Net(bad=None).eval()
    path = tmp_path / "watch.jsonl"
    _watched(m, [torch.randn(2, 4), torch.randn(2, 4)], level="blocks", trace=str(path))
    t = read_trace(path)
    assert [e.step for e in t.entries if e.module == ""] == [0, 1]  # one step per root call
    assert {e.module for e in t.entries} >= {"layers.0.lin", "head"}  # every module, whatever the level


def test_fp16_overflow_is_diagnosed_as_overflow():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(4, 4, bias=False)
            self.down = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return self.down(self.up(x))

    m = Scaled()
    with torch.no_grad():
        m.up.weight.fill_(1.0)
        m.down.weight.fill_(30000.0)  # 4 · 4 · 30000 > 65504
    m = m.half().eval()
    w = _watched(m, [torch.ones(1, 4, dtype=torch.float16)], level="modules")
    r = w.report()
    f = r.first_nonfinite
    assert f.module == "down" and f.kind == "posinf" and f.op in ("aten.mm.default", "aten.addmm.default")
    assert r.diagnosis is not None and r.diagnosis.cause == "overflow"
    assert r.replay["fp32"]["finite"] and not r.replay["fp16"]["finite"]
    with torch.no_grad():
        assert math.isinf(float(m(torch.ones(1, 4, dtype=torch.float16)).max()))


def test_a_watch_holds_its_recorder_and_reads_through_to_it():
    from nan_hunter.capture.recorder import Recorder

    m = nn.Sequential(nn.Linear(2, 2))
    w = Watch(m, level="modules")
    assert not isinstance(w, Recorder) and isinstance(w.recorder, Recorder)
    with w, torch.no_grad():
        m(torch.ones(1, 2))
        m(torch.full((1, 2), math.nan))
    assert (w.n_forwards, w.first_failed, w.level) == (2, 1, "modules")
    assert w.calls == w.recorder.calls and w.sink is w.recorder.sink and w.model is m
    w.paused = True
    assert w.recorder.paused
    w.paused = False
    w.label_step(40)  # a framework's step counter at the next forward
    assert w.step_label(2) == 40 and w.step_label(1) == 1


def test_collective_is_an_option_watch_sets():
    import nan_hunter

    assert WatchOptions().collective is False
    with pytest.raises(ValueError, match="collective must be True or False"):
        WatchOptions(collective="yes")
    m = nn.Linear(2, 2)
    assert nan_hunter.watch(m).collective is True and Watch(m).collective is False
    w = Watch(m, collective=True)
    with w, torch.no_grad():
        m(torch.ones(1, 2))
    assert w.local_report().first_nonfinite is None and w.collective is True
