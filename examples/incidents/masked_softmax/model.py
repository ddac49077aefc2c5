"""Softmax over a fully masked row is NaN in every dtype (pytorch/pytorch issues 41508, 103749).

A padding mask is applied with ``masked_fill(-inf)`` before the softmax. The second
sequence of the batch is all padding, so every score in its rows is −inf and softmax
computes ``-inf - (-inf)`` = NaN, in fp32, bf16 and fp16 alike. The −inf values themselves
are an intentional mask (they never leave ``attn``); the fault is the NaN from softmax.

Expected (default fp32 run): producer ``attn`` (:class:`MaskedSelfAttention`), op
``aten._softmax.default``, kind nan, cause ``masked_softmax``; finite in no dtype.
Fix: give fully masked rows a defined result (``torch.where`` on the mask, a safe softmax
as in SDPA since PyTorch 2.5) or drop empty sequences from the batch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 8


class MaskedSelfAttention(nn.Module):
    """Single-head self-attention with a key padding mask (1 = keep, 0 = padding)."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
        padding = (attention_mask == 0)[:, None, :]  # (batch, 1, keys)
        scores = scores.masked_fill(padding, float("-inf"))  # an intentional -inf mask
        probs = torch.softmax(scores, dim=-1)  # all -inf row -> NaN
        return probs @ v


class TinyEncoder(nn.Module):
    """One attention layer with its residual."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = MaskedSelfAttention()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.attn(hidden_states, attention_mask)


def build() -> nn.Module:
    """Small seeded weights."""
    model = TinyEncoder()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """A batch of two 3-token sequences; the second one is entirely padding."""
    g = torch.Generator().manual_seed(1)
    return {
        "inputs": {
            "hidden_states": torch.randn(2, 3, HIDDEN, generator=g),
            "attention_mask": torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.int64),
        }
    }
