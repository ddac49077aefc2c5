"""Negative control: a standard causal −inf mask that softmax absorbs (docs/contract.md,
"Intentional −inf masks").

The attention module builds ``full(-inf).triu(1)``, adds it to the scores and takes the
softmax, all in its own forward. Every row keeps at least its diagonal, so softmax maps the
−inf entries to exact zeros and no module output is non-finite, in fp32, bf16 or fp16.
The −inf values are mask values, not faults: at most a note, never exit 1.

Expected (``--dtype fp16``): exit 0, no first non-finite value, no diagnosis.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 8


class CausalSelfAttention(nn.Module):
    """Single-head causal self-attention with an additive −inf mask."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
        mask = torch.full((seq, seq), float("-inf"), dtype=scores.dtype, device=x.device).triu(1)
        probs = torch.softmax(scores + mask, dim=-1)  # -inf -> 0, every row has its diagonal
        return self.o_proj(probs @ v)


class TinyDecoder(nn.Module):
    """One attention layer with its residual."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = CausalSelfAttention()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.attn(hidden_states)


def build() -> nn.Module:
    """Small seeded weights."""
    model = TinyDecoder()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """One sequence of five tokens."""
    g = torch.Generator().manual_seed(1)
    return {"inputs": {"hidden_states": torch.randn(1, 5, HIDDEN, generator=g)}}
