"""capture/listener.py: the questions a ``Recorder`` asks whoever builds on it, with the plain
recorder's answers — keep no inputs, accept every fault, judge late phases lazily, keep the failing
step's root gradients only — and callbacks that do nothing; a recorder calls them at its points."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.listener import CaptureListener
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
