"""An attention mask made of ``finfo.min`` planes overflows to −inf in fp16
(huggingface/transformers PR 17306).

The additive mask is the sum of a causal plane and a padding plane, each holding
``torch.finfo(dtype).min`` where a key is hidden. Where both apply their sum is −inf (in any
dtype), and in fp16 a hidden score of −32 added to ``finfo(fp16).min`` = −65504 rounds to
−inf too (``-65504 + (-16)`` already does). With two tokens of left padding the first two
query rows see no visible key: in fp32/bf16 they hold ``min + score`` (finite, the softmax
is merely uniform); in fp16 every entry is −inf and softmax returns NaN.

Expected (``--dtype fp16``): producer ``attn`` (:class:`PaddedCausalAttention`), op
``aten._softmax.default`` (the −inf entries stay inside ``attn``: they are mask values, the
fault is the softmax NaN), kind nan, cause ``masked_softmax``; fp32 and bf16 finite.
Fix: build the mask from booleans with ``torch.where`` (one ``finfo.min`` fill, never a
sum of two planes) and clamp the masked scores to ``finfo(dtype).min``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 4


class PaddedCausalAttention(nn.Module):
    """Single-head causal attention whose additive mask is built the pre-PR-17306 way."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
        min_value = torch.finfo(scores.dtype).min
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        causal = torch.zeros(seq, seq, dtype=scores.dtype, device=x.device).masked_fill(future, min_value)
        padding = (1.0 - attention_mask[:, None, :].to(scores.dtype)) * min_value
        mask = causal + padding  # min + min = -inf where both apply
        probs = torch.softmax(scores + mask, dim=-1)  # fp16: -32 + min = -inf, row all -inf -> NaN
        return probs @ v


class TinyDecoder(nn.Module):
    """One attention layer with its residual."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = PaddedCausalAttention()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.attn(hidden_states, attention_mask)


def build() -> nn.Module:
    """``q = x``, ``k = -x``: every score between positive hidden states is negative."""
    model = TinyDecoder()
    g = torch.Generator().manual_seed(0)
    attn = model.attn
    with torch.no_grad():
        attn.q_proj.weight.copy_(torch.eye(HIDDEN))
        attn.k_proj.weight.copy_(-torch.eye(HIDDEN))
        attn.v_proj.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=g) * 0.3)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """One 4-token sequence, left-padded by two; all hidden values are 4 (scores = -32)."""
    return {
        "inputs": {
            "hidden_states": torch.full((1, 4, HIDDEN), 4.0),
            "attention_mask": torch.tensor([[0, 0, 1, 1]], dtype=torch.int64),
        }
    }
