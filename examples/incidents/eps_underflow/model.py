"""An eps that rounds to zero in fp16 (huggingface/diffusers PR 13316).

``F.normalize(x, eps=1e-12)`` divides by ``max(||x||, eps)``. 1e-12 is below fp16's
smallest subnormal (6e-08), so in fp16 the clamp is a no-op and a zero row gives
``0 / 0`` = NaN. fp32 and bf16 (fp32's exponent range) hold 1e-12: ``0 / 1e-12`` = 0.

Expected (``--dtype fp16``): producer ``norm`` (:class:`L2Normalize`), op
``aten.div.Tensor`` (``linalg_vector_norm`` and ``clamp_min`` both return a finite 0 first),
kind nan, cause ``division_by_zero``. Fix: compute the norm in fp32, or use an eps the
dtype can hold (fp16's smallest normal is 6.1e-05).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN = 8


class L2Normalize(nn.Module):
    """Unit-normalize the last dimension, as diffusers' ``F.normalize`` call did."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1, eps=self.eps)  # eps -> 0 in fp16: 0 / 0 = NaN


class Embedder(nn.Module):
    """A projection followed by L2 normalization (an embedding head)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.norm = L2Normalize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


def build() -> nn.Module:
    """Seeded projection weights (no bias, so a zero row stays zero)."""
    model = Embedder()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.proj.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=g) * 0.3)
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Three rows; the second is all zeros (e.g. an empty/blank item)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, HIDDEN, generator=g)
    x[1] = 0.0
    return {"inputs": {"x": x}}
