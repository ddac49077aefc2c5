"""nan_hunter/capture/run.py: one input at a run's precision and grad mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.capture.run import forward
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


def test_forward_with_grad_and_a_modes_step():
    m = Kw()
    out = forward(m, {"x": torch.ones(1, 2)}, grad=True)
    assert out.requires_grad
    assert forward(m, {}, step=lambda: torch.is_grad_enabled()) is False
