"""The recorder's public API for collaborators (gradients, optimizer steps, sessions, re-runs):
``first_step``, ``renumber_steps``, ``calls_of``, ``current_step``, ``measure`` and the listener."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.capture.listener import CaptureListener
from nan_hunter.capture.recorder import Recorder


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_first_step_numbers_a_rerun_as_the_step_it_repeats():
    m = _model()
    rec = Recorder(m, level="modules", retain=2, first_step=7)
    assert rec.current_step == 6
    with rec, torch.no_grad():
        m(torch.ones(1, 4))
    assert rec.current_step == 7 and {c.input_index for c in rec.calls} == {7}
    assert rec.calls_of(7) and rec.calls_of(3) is None


def test_renumber_steps_maps_local_steps_to_data_set_indices():
    m = _model()
    rec = Recorder(m, level="modules", retain=3)
    with rec, torch.no_grad():
        for _ in range(2):
            m(torch.ones(1, 4))
    rec.renumber_steps([4, 9])
    assert sorted({c.input_index for c in rec.calls}) == [4, 9]


def test_measure_gives_rows_of_the_current_step():
    m = _model()
    rec = Recorder(m, level="modules", retain=2)
    with rec, torch.no_grad():
        m(torch.ones(1, 4))
        refs = rec.measure([("x", torch.tensor([1.0, float("inf")]))])
    assert [label for label, _ in refs] == ["x"]
    st = rec.sink.rows()[refs[0][1]]
    assert st.posinf == 1 and st.absmax == 1.0


class Spy(CaptureListener):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def keeps_inputs(self) -> bool:
        return True

    def on_root_call(self, step: int) -> None:
        self.events.append(("root", step))

    def on_first_fault(self, step: int, phase: str) -> None:
        self.events.append(("fault", step, phase))


def test_the_listener_hears_root_calls_and_the_first_fault():
    m = _model()
    spy = Spy()
    rec = Recorder(m, level="modules", retain=4, listener=spy)
    with rec, torch.no_grad():
        m(torch.ones(1, 4))
        m(torch.full((1, 4), float("nan")))
        m(torch.full((1, 4), float("nan")))
    assert spy.events == [("root", 0), ("root", 1), ("fault", 1, "forward"), ("root", 2)]
    assert rec.inputs_of(1) is not None  # kept: the listener asked for inputs
