"""log out of its domain: NaN in every dtype (docs/incidents.md, "log / sqrt out of domain").

A Gaussian head predicts a variance with a plain ``Linear`` and takes its log, but nothing
keeps the variance positive (the softplus was forgotten): for this input one predicted
variance is negative, and ``log`` of a negative is NaN in fp32, bf16 and fp16 alike.

Expected (default fp32 run): producer ``logvar`` (:class:`LogVariance`), op
``aten.log.default``, kind nan, cause ``domain_error``; finite in no dtype.
Fix: clamp the argument (``clamp(min=eps)``) or make it positive by construction
(softplus / exp), or fix the upstream sign.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN = 4


class LogVariance(nn.Module):
    """``log(proj(x))``: the projection is meant to be a variance, but is unconstrained."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(self.proj(x))  # log(-0.5) = NaN


class GaussianHead(nn.Module):
    """Predicts a mean and a log-variance from a feature vector."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Linear(HIDDEN, 1)
        self.logvar = LogVariance()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.mean(x), self.logvar(x)], dim=-1)


def build() -> nn.Module:
    """Variance head = 0.25·sum(x) + 0.5: negative once sum(x) < -2."""
    model = GaussianHead()
    with torch.no_grad():
        model.mean.weight.fill_(0.5)
        model.mean.bias.zero_()
        model.logvar.proj.weight.fill_(0.25)
        model.logvar.proj.bias.fill_(0.5)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Two rows: the first gives variance 1.5, the second -0.5."""
    return {"inputs": {"x": torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])}}
