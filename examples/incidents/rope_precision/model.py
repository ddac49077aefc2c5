"""RoPE angles computed in bf16/fp16: large error, nothing non-finite
(huggingface/transformers PR 29285). A negative control.

The rotary embedding multiplies positions by ``inv_freq`` in the run's dtype. At
positions ~1040 bf16 has a spacing of 8, so the angle itself is off by up to 4 radians and
``cos`` differs from fp32 by up to 2.0 (fp16: ~0.8). Every value stays finite.

Expected (``--dtype bf16``): exit 0, no first non-finite value, no diagnosis; finite in
fp32, bf16 and fp16 (the error is large: see ``verify.py``). Fix (not a NaN): compute the
angles in fp32, as transformers now does.
"""

from __future__ import annotations

import torch
from torch import nn

HEAD_DIM = 8
BASE = 10000.0


class RotaryEmbedding(nn.Module):
    """Rotate pairs of channels by ``position * inv_freq``, computed in the input's dtype."""

    def __init__(self, head_dim: int = HEAD_DIM, base: float = BASE) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq)  # persistent: lives in the checkpoint

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        angles = position_ids[..., None].to(x.dtype) * self.inv_freq  # bf16: 1041 -> 1040
        emb = torch.cat([angles, angles], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class RotaryQuery(nn.Module):
    """A query projection followed by the rotary embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HEAD_DIM, HEAD_DIM, bias=False)
        self.rope = RotaryEmbedding()

    def forward(self, hidden_states: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.rope(self.q_proj(hidden_states), position_ids)


def build() -> nn.Module:
    """Identity query projection, so the output is the rotated input."""
    model = RotaryQuery()
    with torch.no_grad():
        model.q_proj.weight.copy_(torch.eye(HEAD_DIM))
    return model


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Eight tokens at positions 1033..1040 (int64: ``--dtype`` leaves them alone)."""
    g = torch.Generator().manual_seed(0)
    return {
        "inputs": {
            "hidden_states": torch.randn(1, 8, HEAD_DIM, generator=g),
            "position_ids": torch.arange(1033, 1041, dtype=torch.int64)[None],
        }
    }
