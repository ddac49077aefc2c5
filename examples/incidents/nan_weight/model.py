"""A corrupted checkpoint: NaN stored in a Linear weight (docs/incidents.md, ``nonfinite_weights``).

``decoder.weight[2, 1]`` is NaN in ``model.safetensors`` (the weights scan finds it before
anything runs). Running the model, ``encoder`` is clean and ``decoder`` is the first module
whose own parameters are non-finite and that emits NaN because of them.

Expected (default fp32 run): role ``weights``, module ``decoder`` (``Linear``), op
``aten.addmm.default`` (2-D input with bias), kind nan, cause ``nonfinite_weights``; finite
in no dtype. Fix: restore the checkpoint from a good copy (re-download / re-save), or find
the training step that wrote the NaN.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN = 4

#: Where the NaN sits in the checkpoint.
BAD_PARAM = "decoder.weight"
BAD_INDEX = (2, 1)


class AutoEncoder(nn.Module):
    """``decoder(tanh(encoder(x)))``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(HIDDEN, 2)
        self.act = nn.Tanh()
        self.decoder = nn.Linear(2, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.act(self.encoder(x)))


def build() -> nn.Module:
    """Seeded weights with the planted NaN (this is what ``model.safetensors`` stores)."""
    model = AutoEncoder()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        model.get_parameter(BAD_PARAM)[BAD_INDEX] = float("nan")
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """A clean batch of two rows."""
    return {"inputs": {"x": torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 0.25, -0.75, -0.5]])}}
