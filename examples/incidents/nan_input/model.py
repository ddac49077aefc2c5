"""Data that is already bad: a NaN in the input batch (docs/incidents.md, cause ``nonfinite_input``).

The model is clean; one feature of the second row is NaN before anything runs. The
root module receives it first, but the first module that consumes it (and emits NaN) is
``proj``.

Expected (default fp32 run): role ``input``, module ``proj`` (``Linear``), kind nan,
cause ``nonfinite_input``; no op produced the NaN (``op`` null; the first op whose output is
non-finite is ``proj``'s ``aten.addmm.default``). Fix: clean or filter the input data
(check the data loader / preprocessing).
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN = 4


class Classifier(nn.Module):
    """``head(relu(proj(x)))``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.act = nn.ReLU()
        self.head = nn.Linear(HIDDEN, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.proj(x)))


def build() -> nn.Module:
    """Seeded, finite weights."""
    model = Classifier()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Two rows; ``x[1, 2]`` is NaN."""
    x = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 0.25, float("nan"), -0.5]])
    return {"inputs": {"x": x}}
