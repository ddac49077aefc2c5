"""FP8 rowwise + torch.compile + RMSNorm: compiled and eager part (docs/incidents.md #3,
pytorch/torchtitan issue 1056, pytorch/pytorch issue 150859).

A torchtitan-shaped block in bf16: ``norm`` (``F.rms_norm``) then ``proj``, a Float8Linear-like
layer that quantises its input rowwise to e4m3 (amax per row, ``scale = 448 / amax``) and its
weight the same way, multiplies, and unscales. Eager rounds the norm's output to bf16 before
the quantiser reads it; inductor fuses norm → quantise and keeps that intermediate in fp32, so
some values land on the other side of an e4m3 rounding boundary: on this 64×256 input 263 of
the 16,384 fp8 bytes differ (torch 2.13, CPU), and none with
``torch._inductor.config.emulate_precision_casts = True``.

``build()``: the block's output parts from eager by more than 1e-2 (``scan --compile``: exit 1,
cause ``compile_divergence``, first divergent module ``layers.0``: each child alone matches
eager, the fused pair does not; emulate_precision_casts closes the gap).
``build_nan()``: the same weights with a min-max rescale of the dequantised row after the
quantiser (``(q - min) / (max - min)``, no eps). Row 0 of ``inputs_nan`` is built so that every
element quantises to 448 when compiled (max = min: 0/0 = NaN) but not in eager (416 and 448):
the difference becomes a NaN only in the compiled run. Both run with ``--dtype bf16``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM, OUT, ROWS = 256, 64, 64
E4M3_MAX = 448.0


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 bytes and the fp32 scale of each row (torchao's rowwise recipe, amax clamped)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


class RMSNorm(nn.Module):
    def __init__(self, dim: int = DIM, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Float8Linear(nn.Linear):
    """Rowwise e4m3 quantisation of input and weight, matmul, unscale (emulated on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qx, sx = quantize_rowwise(x)
        qw, sw = quantize_rowwise(self.weight)
        return ((qx.float() @ qw.float().t()) / (sx * sw.t())).to(x.dtype)


class Float8MinMax(nn.Module):
    """Rowwise e4m3 quantise-dequantise, then rescale each row to [0, 1] (no eps: a constant row is 0/0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, s = quantize_rowwise(x)
        d = q.float() / s
        lo, hi = d.amin(dim=-1, keepdim=True), d.amax(dim=-1, keepdim=True)
        return ((d - lo) / (hi - lo)).to(x.dtype)


class Block(nn.Module):
    def __init__(self, minmax: bool = False) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.quant = Float8MinMax() if minmax else None
        self.proj = Float8Linear(DIM, OUT, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if self.quant is not None:
            h = self.quant(h)
        return self.proj(h)


class TinyTitan(nn.Module):
    def __init__(self, minmax: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(minmax)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _init(model: TinyTitan) -> TinyTitan:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.layers[0].norm.weight.fill_(NORM_GAIN)
        model.layers[0].proj.weight.copy_(torch.randn(OUT, DIM, generator=g) / DIM**0.5)
    return model


def build() -> nn.Module:
    """norm → Float8Linear: compiled and eager part by more than 1e-2."""
    return _init(TinyTitan())


def build_nan() -> nn.Module:
    """norm → Float8MinMax → Float8Linear (same weights): NaN only when compiled."""
    return _init(TinyTitan(minmax=True))


NORM_GAIN = 1.25  # the norm's weight (a trained gain; 1.0 would put the bf16 grid elsewhere)
# Row 0 of inputs_nan: N_A elements A, the rest B. After the norm, inductor scales the fp32 value
# of B by 448 / amax and lands at or above 432, the tie between e4m3's 416 and 448: the whole row
# is 448 when compiled. Eager rounds the normed row to bf16 first, which pulls B below 432: 416,
# and the row is not constant. (Found by searching bf16 rows on this CPU; torch 2.13.)
NAN_ROW = (1.0, 0.96484375, 30)  # A, B, N_A


def make_inputs() -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, DIM, generator=g).to(torch.bfloat16)
    xn = x.clone()
    a, b, n_a = NAN_ROW
    xn[0] = b
    xn[0, :n_a] = a
    return {"inputs": {"x": x}, "inputs_nan": {"x": xn}}
