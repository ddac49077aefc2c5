"""T5 feed-forward ``wo`` overflows in fp16 (huggingface/transformers issue 5651).

``T5DenseActDense``: ``wo(dropout(relu(wi(x))))``. Here ``wi`` turns an all-ones hidden
state into 8 on each of 4 inner channels and ``wo``'s weights are 2071 (2072 in fp16):
``linear(ones*8, W=2071)`` over 4 inputs = 66272 > 65504, +inf in fp16. bf16 rounds it to
66048 (finite), fp32 is exact.

Expected (``--dtype fp16``): producer ``ffn.wo`` (``Linear``, no bias, 3-D input), op
``aten.mm.default`` (a bias-free ``F.linear`` on a 3-D input is ``view`` + ``mm`` +
``_unsafe_view`` on CPU; with a bias it would be ``addmm``), kind posinf, cause
``overflow``. Fix: keep ``wo`` in fp32 (transformers' ``_keep_in_fp32_modules``) or run in
bf16; older fix: clamp to ``finfo(fp16).max - 1000``.
"""

from __future__ import annotations

import torch
from torch import nn

D_MODEL = 8
D_FF = 4


class DenseActDense(nn.Module):
    """T5's feed-forward: ``wo(relu(wi(x)))`` (dropout omitted: inference)."""

    def __init__(self, d_model: int = D_MODEL, d_ff: int = D_FF) -> None:
        super().__init__()
        self.wi = nn.Linear(d_model, d_ff, bias=False)
        self.act = nn.ReLU()
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi(x)))  # wo: 4 · 8 · 2071 = 66272 -> +inf in fp16


class TinyT5Layer(nn.Module):
    """The feed-forward sub-layer with its residual."""

    def __init__(self) -> None:
        super().__init__()
        self.ffn = DenseActDense()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.ffn(hidden_states)


def build() -> nn.Module:
    """``wi`` = 1 everywhere (ones → 8), ``wo`` = 2071 everywhere."""
    model = TinyT5Layer()
    with torch.no_grad():
        model.ffn.wi.weight.fill_(1.0)
        model.ffn.wo.weight.fill_(2071.0)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Two tokens of all-ones hidden states."""
    return {"inputs": {"hidden_states": torch.ones(1, 2, D_MODEL)}}
