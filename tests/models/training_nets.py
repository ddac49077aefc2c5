"""Small training models shared by tests (``--arch tests/models/training_nets.py:build_gate``, or
imported): a ``Gate`` whose backward divides by zero, an autocast ``Scale``, a plain MLP."""

from __future__ import annotations

import torch
from torch import nn


class Gate(nn.Module):
    """x · sqrt(mean(x²)): finite forward at x = 0, but d/dx sqrt at 0 is infinite."""

    def forward(self, x):
        return x * torch.sqrt((x * x).mean(-1, keepdim=True))


class Block(nn.Module):
    def __init__(self, dim: int = 4):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.gate = Gate()
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.out(self.gate(self.lin(x)))


class Net(nn.Module):
    """Two gated blocks and a head: zeroing ``layers[1].lin`` feeds the gate zeros, so the next
    backward divides by sqrt(0) = 0 (``SqrtBackward0``) while the forward stays finite."""

    def __init__(self, dim: int = 4):
        super().__init__()
        self.layers = nn.ModuleList([Block(dim), Block(dim)])
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


class Scale(nn.Module):
    """(x · 1e-3) · 1e3: its backward multiplies the incoming gradient by 1e3 first."""

    def forward(self, x):
        return (x * 1e-3) * 1e3


def build_scale() -> nn.Module:
    m = nn.Sequential(nn.Linear(4, 4), Scale(), nn.Linear(4, 1))
    with torch.no_grad():
        m[2].weight.fill_(0.5)
    return m


def build_gate() -> nn.Module:
    return Net()


def build_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
