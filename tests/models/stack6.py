"""Six blocks; blocks 1 and 4 compute an intermediate of ~1e5 that overflows fp16 (their output
fits again), so keeping exactly those two in fp32 makes an fp16 run finite."""

from __future__ import annotations

import torch
from torch import nn

HOT = (1, 4)


class Block(nn.Module):
    """A leaf block: y = x + tanh((x @ w) * gain) / gain · 1e-3 — with gain 1e5 the intermediate
    (x @ w) * gain passes 65504 in fp16 while the output stays small."""

    def __init__(self, dim: int, gain: float):
        super().__init__()
        self.w = nn.Parameter(torch.eye(dim))
        # sqrt(gain) twice: each factor fits fp16 (1e5 itself would be inf there)
        self.register_buffer("root_gain", torch.tensor(gain**0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x @ self.w) * self.root_gain * self.root_gain
        return x + torch.tanh(h) * 1e-3 + h * 0  # h * 0: inf * 0 = NaN when h overflowed


class Stack(nn.Module):
    def __init__(self, dim: int = 8, n: int = 6):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim, 1e5 if i in HOT else 1.0) for i in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build() -> nn.Module:
    return Stack()


def build_bad_everywhere() -> nn.Module:
    """Fails in fp32 too: log of a negative."""
    return LogNeg()


class LogNeg(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.full((8,), -5.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x + self.bias)
