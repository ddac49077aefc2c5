"""fp16 → fp8 quantization turns zeros into NaN (docs/incidents.md #1, pytorch/ao issue 1766).

A per-tensor e5m2 quantizer computes ``amax`` and ``scale = amax / 57344`` in the run's
dtype. For ``x = [[0, 0, 0.1, 0.1]]`` in fp16 the scale is 1.7285e-06, a subnormal whose
reciprocal (≈ 578,000) is beyond fp16's 65504: ``scale.reciprocal()`` is +inf, and then
``0 * inf`` is NaN. Output: ``[nan, nan, 57344, 57344]``.

Expected (run with ``--dtype fp16``): producer ``quant`` (:class:`Fp8Quantizer`), op
``aten.reciprocal.default`` (+inf, one op before the first NaN from ``aten.mul.Tensor``),
cause ``scale_underflow``. fp32 and bf16 stay finite. Fix: compute amax and the scale in
fp32 and clamp amax with an eps (torchao: ``finfo(f8).max / clamp(amax.double(), min=1e-12)``).
"""

from __future__ import annotations

import torch
from torch import nn

E5M2_MAX = 57344.0


class Fp8Quantizer(nn.Module):
    """Scale a tensor into the e5m2 range (emulated: scaled and saturated, no fp8 cast)."""

    def __init__(self, fp8_max: float = E5M2_MAX) -> None:
        super().__init__()
        # A buffer, so that ``--dtype`` casts it with everything else (as the bug needs).
        self.register_buffer("fp8_max", torch.tensor(fp8_max))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.abs().amax()
        scale = amax / self.fp8_max  # 1.7285e-06 in fp16: subnormal
        inv_scale = scale.reciprocal()  # +inf in fp16  <- first non-finite value
        scaled = x * inv_scale  # 0 * inf = NaN
        return scaled.clamp(-self.fp8_max, self.fp8_max)


class QuantizedInput(nn.Module):
    """The smallest model around the quantizer: its output is the quantized tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.quant = Fp8Quantizer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant(x)


def build() -> nn.Module:
    """Return the model (its only state is the ``quant.fp8_max`` buffer)."""
    return QuantizedInput()


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    """Input files to write, by stem: the incident's tensor, stored in fp16."""
    return {"inputs": {"x": torch.tensor([[0.0, 0.0, 0.1, 0.1]], dtype=torch.float16)}}
