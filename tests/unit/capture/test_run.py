"""nan_hunter/capture/run.py: one forward at a run's precision, every batch recorded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.run import capture_run, forward
from nan_hunter.errors import BadInput


class Kw(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)


def test_forward_runs_without_grad_and_a_model_error_is_bad_input():
    m = Kw()
    out = forward(m, {"x": torch.ones(1, 2)})
    assert out.shape == (1, 2) and not out.requires_grad
    with pytest.raises(BadInput, match=r"the model raised RuntimeError in Kw.forward\(\)"):
        forward(m, {"x": torch.ones(1, 3)})  # wrong width


def test_capture_run_records_every_batch():
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    rec = capture_run(m, [{"input": torch.ones(1, 2)}, {"input": torch.zeros(1, 2)}])
    assert rec.n_forwards == 2
    assert {c.input_index for c in rec.calls} == {0, 1}
    assert not m._forward_hooks and not m[0]._forward_pre_hooks  # detached afterwards
