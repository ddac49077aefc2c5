"""``locate.judged_recording.Recording``: a capture judged by the producer rule, the same whoever made it."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.capture.recorder import Recorder
from nan_hunter.locate.judged_recording import Recording


def _recorder(inputs: list[torch.Tensor], model: nn.Module | None = None) -> Recorder:
    m = model or nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    if model is None:
        with torch.no_grad():
            m[0].weight.fill_(1.0)  # 3e38 + 3e38 overflows float32
            m[0].bias.zero_()
    rec = Recorder(m, level="modules", retain=len(inputs))
    with rec:
        for x in inputs:
            m(x)
    return rec


def test_first_fault_failed_steps_tables_and_notes():
    r = Recording.of(
        _recorder([torch.ones(1, 2), torch.full((1, 2), float("nan")), torch.full((1, 2), 3e38)])
    )
    assert r.finding.call.input_index == 1 and r.finding.role == "input"  # the data held the NaN
    assert r.failed == [1, 2]
    assert {row["input_index"] for row in r.table()} == {0, 1, 2}
    assert {row["input_index"] for row in r.table([2])} == {2}


def test_a_mask_of_minus_inf_is_a_note_not_a_fault():
    r = Recording.of(_recorder([torch.tensor([[float("-inf"), -1.0]])], nn.Sequential(nn.Softmax(-1))))
    assert r.finding is None and r.failed == []
    assert any(n.startswith("mask:") for n in r.notes) and r.step_notes(0) == r.notes


def test_skipped_backward_passes_are_not_judged():
    m = nn.Linear(2, 1)
    rec = Recorder(m, level="modules", retain=2, backward=True)
    with rec:
        out = m(torch.ones(1, 2))
        out.backward(torch.full_like(out, float("inf")))  # a scaled gradient that overflowed
    assert Recording.of(rec).finding is not None
    assert Recording.of(rec, skipped_backward=[0]).finding is None  # a GradScaler's skip is not a fault
