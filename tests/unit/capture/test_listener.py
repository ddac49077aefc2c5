"""capture/listener.py: the questions a ``Recorder`` asks whoever builds on it, with the plain
recorder's answers — keep no inputs, accept every fault, judge late phases lazily, keep the failing
step's root gradients only — and callbacks that do nothing; a recorder calls them at its points.
``CallObserver``: every module call of the one recording, whatever its level (a numerics trace),
with the recorder's source-line finder (``capture.ops.ModelSites``)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn

from nan_hunter.capture.listener import CallObserver, CaptureListener
from nan_hunter.capture.ops import ModelSites
from nan_hunter.capture.recorder import Recorder


def test_the_plain_answers():
    c = CaptureListener()
    assert (c.keeps_inputs(), c.accept_fault(3, "backward"), c.judge_late_now()) == (False, True, False)
    assert c.grads_needed(2, 2) is True and c.grads_needed(1, 2) is False and c.grads_needed(1, None) is False
    for cb in (c.on_root_call, c.on_forget, c.on_forward_end):
        assert cb(0) is None
    assert c.on_first_fault(0, "forward") is None and c.on_optimizer_start(0, None) is None
    assert c.on_optimizer_end(0, []) is None


class Seen(CaptureListener):
    def __init__(self):
        self.events: list[tuple] = []

    def on_root_call(self, step):
        self.events.append(("root", step))

    def on_forward_end(self, step):
        self.events.append(("end", step))

    def on_first_fault(self, step, phase):
        self.events.append(("fault", step, phase))


@pytest.mark.parametrize("bad_at", [None, 1])
def test_a_recorder_calls_its_listener(bad_at):
    m = nn.Sequential(nn.Linear(2, 2))
    seen = Seen()
    with torch.no_grad(), Recorder(m, level="modules", listener=seen):
        for i in range(3):
            m(torch.full((1, 2), float("inf") if i == bad_at else 1.0))
    roots = [e for e in seen.events if e[0] == "root"]
    assert roots == [("root", 0), ("root", 1), ("root", 2)]
    faults = [e for e in seen.events if e[0] == "fault"]
    assert faults == ([] if bad_at is None else [("fault", bad_at, "forward")])


# --- CallObserver: what a numerics trace sees of the one recording ----------------------------------


class Calls(CallObserver):
    def __init__(self, repeat: int = 1):
        self.seen: list[tuple] = []
        self.repeat = repeat
        self.inputs: list[int] = []
        self.runs: list[int] = []

    def call_start(self, name, module, args, kwargs):
        self.seen.append(("start", name))

    def call_end(self, name, module, args, kwargs, output):
        self.seen.append(("end", name))

    def repeats(self):
        return self.repeat

    @contextlib.contextmanager
    def input(self, index):
        self.inputs.append(index)
        yield

    @contextlib.contextmanager
    def run(self, r):
        self.runs.append(r)
        yield


def test_the_base_observer_sees_nothing_and_runs_each_input_once():
    o = CallObserver()
    assert o.op_mode() is None and o.repeats() == 1
    with o.input(0), o.run(0):
        pass


@pytest.mark.parametrize("level", ["sentinel", "blocks", "modules"])
def test_observers_see_every_module_call_whatever_the_capture_level(level):
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    calls = Calls()
    x = torch.ones(1, 2)
    with torch.no_grad():
        plain = m(x)
        with Recorder(m, level=level, observers=[calls]) as rec:
            out = m(x)
            rec.paused = True  # a report's re-runs: neither capture nor observers
            m(x)
    assert torch.equal(plain, out)
    assert calls.seen == [
        ("start", ""),
        ("start", "0"),
        ("end", "0"),
        ("start", "1"),
        ("end", "1"),
        ("end", ""),
    ]
    assert rec.n_forwards == 1
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())


def test_a_recorder_without_capture_only_hooks_for_its_observers():
    m = nn.Sequential(nn.Linear(2, 2))
    calls = Calls()
    with torch.no_grad(), Recorder(m, capture=False, observers=[calls]) as rec:
        m(torch.ones(1, 2))
    assert rec.n_forwards == 0 and rec.calls == [] and len(calls.seen) == 4


def test_input_run_repeats_for_the_observers_with_the_capture_paused():
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    calls = Calls(repeat=3)
    outs = []
    with torch.no_grad(), Recorder(m, level="modules", observers=[calls]) as rec:
        torch.manual_seed(0)
        rec.input_run(7, lambda: outs.append(m(torch.ones(4, 2))))
    assert calls.inputs == [7] and calls.runs == [0, 1, 2]
    assert rec.n_forwards == 1 and len(outs) == 3  # captured once, observed three times
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # from the same RNG state
    assert rec.rerun_steps is None and not rec.paused


def test_model_sites_name_the_models_own_line_not_torchs():
    sites = ModelSites()
    here = sites.site(0)
    assert here is not None and here[0] == __file__
    seen: list[Any] = []

    class Where(nn.Module):
        def forward(self, x):
            seen.append(sites.site(0))
            return x

    nn.Sequential(Where())(torch.ones(1))
    assert seen[0][0] == __file__  # Where.forward, under torch's Sequential and _call_impl
