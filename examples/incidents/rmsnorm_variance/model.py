"""RMSNorm variance overflow: silently wrong, no NaN (pytorch/pytorch PR 133085).

An RMSNorm that computes ``x.pow(2).mean()`` in the run's dtype: in fp16 any |x| ≳ 256
squares past 65504, the variance is +inf, ``rsqrt(inf)`` = 0 and the output row is all
zeros. Every module output is finite, so the run exits 0, but the intermediate +inf is a
near miss the tool must note. fp32 and bf16 compute the right answer.

Expected (``--dtype fp16``): exit 0, no first non-finite value, cause none; a near-miss
note in ``norm`` (:class:`RMSNorm`) at ``aten.pow.Tensor_Scalar`` (+inf inside the
module; its output is finite). Fix (for the note): compute the variance in fp32
(``x.float().pow(2).mean()``), as transformers' ``LlamaRMSNorm`` does.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN = 8


class RMSNorm(nn.Module):
    """RMSNorm without the fp32 upcast."""

    def __init__(self, hidden: int = HIDDEN, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)  # 300**2 = 90000 -> +inf in fp16
        return self.weight * (x * torch.rsqrt(variance + self.eps))  # x * 0 = 0: finite, wrong


class NormThenProject(nn.Module):
    """``proj(norm(x))``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(hidden_states))


def build() -> nn.Module:
    """Seeded projection; the norm weight is ones."""
    model = NormThenProject()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.proj.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=g) * 0.3)
        model.proj.bias.zero_()
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Two tokens; the second has activations around 300 (fp16-representable)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, HIDDEN, generator=g)
    x[0, 1] = torch.linspace(-300.0, 300.0, HIDDEN)
    return {"inputs": {"hidden_states": x}}
