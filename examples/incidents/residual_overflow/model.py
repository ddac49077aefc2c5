"""Gemma in fp16: the residual stream passes 65504 for some prompts (docs/incidents.md #5,
google/gemma_pytorch issue 10).

Block ``layers.0`` computes ``h = x + self.mlp(x)`` in its own forward. For the failing
input the residual holds 40000 in channel 0 and the MLP branch adds 30000: 70000 is +inf
in fp16. The final RMSNorm (upcast to fp32, as Gemma's) then computes ``inf * rsqrt(inf)``
= ``inf * 0`` = NaN. The other input holds 20000 in that channel (20000 + 15000 = 35000)
and stays finite: a data-set view where only some inputs fail.

Expected (``--dtype fp16``, inputs ``[inputs_ok, inputs]``): failed inputs ``[1]``, producer
``layers.0`` (:class:`Block`, the add is in its own forward; ``layers.0.mlp`` is finite),
op ``aten.add.Tensor``, kind posinf, cause ``overflow``. fp32/bf16 finite.
Fix: bf16 or fp32; in fp16, clamp the residual or rescale activations.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN = 8


class MLP(nn.Module):
    """``down(relu(up(x)))``; the weights make the branch 0.75·relu(x)."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, hidden, bias=False)
        self.act = nn.ReLU()
        self.down = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """A residual block: the add lives here, so the block is the producer."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.mlp = MLP(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)  # 40000 + 30000 = +inf in fp16


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: computed in fp32, scaled by ``1 + weight``, cast back."""

    def __init__(self, hidden: int = HIDDEN, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)  # inf * 0 = NaN
        return (out * (1.0 + self.weight.float())).type_as(x)


class TinyGemma(nn.Module):
    """One residual block and a final norm."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block()])
        self.norm = RMSNorm()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


def build() -> nn.Module:
    """Identity ``up`` and ``0.75·I`` ``down``: the branch adds 75% of each positive channel."""
    model = TinyGemma()
    mlp = model.layers[0].mlp
    with torch.no_grad():
        mlp.up.weight.copy_(torch.eye(HIDDEN))
        mlp.down.weight.copy_(0.75 * torch.eye(HIDDEN))
    return model


def _hidden(big: float) -> torch.Tensor:
    """Two tokens of ordinary activations; token 1 carries ``big`` in channel 0."""
    x = torch.linspace(-3.0, 3.0, 2 * HIDDEN).reshape(1, 2, HIDDEN)
    x[0, 1, 0] = big
    return x


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """``inputs`` fails in fp16 (40000 + 30000); ``inputs_ok`` passes (20000 + 15000)."""
    return {
        "inputs": {"hidden_states": _hidden(40000.0)},
        "inputs_ok": {"hidden_states": _hidden(20000.0)},
    }
