"""An fp32 fault that never reaches the model's output (``--arch tests/models/absorbed_scores.py:build``):
q·kᵀ scores with identity projections overflow fp32 at the one masked key position (a token whose
embedding is ~1e20), and the mask then writes −inf over that +inf before softmax. Every dtype
overflows there; the model's output is finite with or without any change."""

from __future__ import annotations

import torch
from torch import nn


class Scores(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.q(x) @ self.k(x).transpose(-1, -2)


class Net(nn.Module):
    def __init__(self, dim: int = 8, seq: int = 4):
        super().__init__()
        self.attn_scores = Scores(dim)
        self.out = nn.Linear(seq, 2)

    def forward(self, x):
        s = self.attn_scores(x)
        masked = torch.zeros(s.shape[-2:], dtype=torch.bool, device=s.device)
        masked[:, -1] = True  # the last key never reaches the output
        return self.out(torch.softmax(s.masked_fill(masked, float("-inf")), -1))


def build() -> nn.Module:
    torch.manual_seed(0)
    m = Net()
    with torch.no_grad():
        m.attn_scores.q.weight.copy_(torch.eye(8))
        m.attn_scores.k.weight.copy_(torch.eye(8))
    return m


def failing_input() -> torch.Tensor:
    """[1, 4, 8]: small tokens, and a last (masked) token of ~1e20 whose score with itself is ~1e41."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 8, generator=g) * 0.1
    x[0, -1] = torch.linspace(1, 2, 8) * 1e20
    return x
