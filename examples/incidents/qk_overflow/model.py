"""Qwen2 in fp16: eager attention scores overflow (docs/incidents.md #4, QwenLM/Qwen2 issues 721, 910).

Eager attention computes ``q @ k^T`` *before* scaling by ``1/sqrt(head_dim)``. With
head_dim 128, q = 3 and k = 200 everywhere, each score is 3·200·128 = 76800 > 65504, so
the fp16 matmul returns +inf; softmax over a row of +inf is ``inf - inf`` = NaN.
fp32 and bf16 hold 76800 easily (the model was trained in bf16).

Expected (``--dtype fp16``): producer ``attn`` (:class:`EagerAttention`; the matmul is in
its own forward, the projections are finite), op ``aten.bmm.default`` (a 4-D
``torch.matmul`` dispatches to ``expand``/``view`` + ``bmm``), kind posinf, cause ``overflow``.
Fix: run in bf16 or fp32, use fused SDPA/flash attention (scales before the product), or
compute the scores with q and k upcast to fp32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 16
HEAD_DIM = 128


class EagerAttention(nn.Module):
    """Single-head attention written like transformers' ``eager_attention_forward``."""

    def __init__(self, hidden: int = HIDDEN, head_dim: int = HEAD_DIM) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden, head_dim)
        self.k_proj = nn.Linear(hidden, head_dim)
        self.v_proj = nn.Linear(hidden, head_dim)
        self.o_proj = nn.Linear(head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        shape = (batch, seq, 1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3))  # 76800 -> +inf in fp16
        scores = scores * (1.0 / math.sqrt(self.head_dim))
        probs = torch.softmax(scores, dim=-1)  # inf - inf = NaN
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, self.head_dim)
        return self.o_proj(out)


class TinyQwenAttention(nn.Module):
    """One attention layer with its residual connection."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = EagerAttention()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.attn(hidden_states)


def build() -> nn.Module:
    """Projections that map an all-ones hidden state to q = 3 and k = 200."""
    model = TinyQwenAttention()
    g = torch.Generator().manual_seed(0)
    attn = model.attn
    with torch.no_grad():
        attn.q_proj.weight.fill_(3.0 / HIDDEN)
        attn.k_proj.weight.fill_(200.0 / HIDDEN)
        attn.q_proj.bias.zero_()
        attn.k_proj.bias.zero_()
        attn.v_proj.weight.copy_(torch.randn(attn.v_proj.weight.shape, generator=g) * 0.1)
        attn.v_proj.bias.zero_()
        attn.o_proj.weight.copy_(torch.randn(attn.o_proj.weight.shape, generator=g) * 0.1)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Two tokens whose hidden states are all ones."""
    return {"inputs": {"hidden_states": torch.ones(1, 2, HIDDEN)}}
