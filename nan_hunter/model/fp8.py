"""Emulated fp8: quantize-dequantize the operands of matmuls and Linear layers.

Numerics, exactly (also in docs/how-it-works.md):

1. ``amax`` = max |x| over the tensor (``tensorwise``) or over the reduction dim K per row of A /
   per column of B (``rowwise``), computed in float64 and clamped below by ``amax_eps``
   (default 1e-12) so an all-zero block cannot give a zero scale.
2. ``scale`` = fp8_max / amax (float64, then float32). ``scaling="none"`` uses scale 1.
3. ``y = x.float() * scale``. Overflow policy, applied *before* any cast: ``saturate`` clamps to
   ±fp8_max; ``nonfinite`` turns |y| > fp8_max into ±inf (e5m2) or NaN (e4m3fn, which has no
   inf) — the behaviour of a cast without saturation. NaN/inf inputs stay non-finite.
4. The in-range values are rounded to the fp8 grid with ``.to(float8_*)`` (round to nearest even;
   range is never left to the cast, whose out-of-range behaviour changed in PyTorch 2.12).
5. Dequantize: ``y8.float() / scale``, back to the compute dtype; the matmul runs there (bf16 by
   default, fp32 on request). Biases and everything outside matmuls stay in the compute dtype.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..dtypes import Fp8Recipe, torch_dtype


def quantize_dequantize(x: torch.Tensor, cfg: Fp8Recipe, dim: int | None = None) -> torch.Tensor:
    """``x`` through fp8 and back, per the numerics in the module docstring.

    ``dim``: the reduction dim for rowwise scaling (amax taken over it, keepdim)."""
    f8 = torch_dtype(cfg.fmt)
    fmax = torch.finfo(f8).max
    xf = x.float()
    if cfg.scaling == "none":
        scale = torch.ones((), dtype=torch.float32, device=x.device)
    else:
        a = xf.abs().double()
        # NaN-safe amax: NaNs must not poison the scale of the finite values
        a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
        amax = a.amax() if cfg.scaling == "tensorwise" or dim is None else a.amax(dim=dim, keepdim=True)
        scale = (fmax / amax.clamp(min=cfg.amax_eps)).float()
        scale = torch.where(torch.isinf(scale), torch.full_like(scale, torch.finfo(torch.float32).max), scale)
    y = xf * scale
    over = y.abs() > fmax
    y = y.clamp(-fmax, fmax)  # NaN stays NaN
    y8 = y.to(f8).float()
    if cfg.overflow == "nonfinite":
        bad = (
            torch.full_like(y8, float("nan"))
            if cfg.fmt == "fp8-e4m3"
            else torch.copysign(torch.full_like(y8, float("inf")), xf)
        )
        y8 = torch.where(over, bad, y8)
    return (y8 / scale).to(x.dtype)


# (op, index of A, index of B) for the matmul-like ops whose operands are quantised
_MATMULS = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "matmul": (0, 1),
}


class FP8Emulation(TorchDispatchMode):
    """Within this mode, every mm/addmm/bmm/baddbmm sees its two matrix operands through fp8."""

    def __init__(self, recipe: Fp8Recipe | str = "fp8-e4m3", **options: object):
        super().__init__()
        self.cfg = recipe if isinstance(recipe, Fp8Recipe) else Fp8Recipe(recipe, **options)  # type: ignore[arg-type]
        self.n_quantized = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        spec = _MATMULS.get(func._opname)
        if spec is not None and func.namespace == "aten":
            ia, ib = spec
            args = list(args)
            a, b = args[ia], args[ib]
            if isinstance(a, torch.Tensor) and a.is_floating_point() and isinstance(b, torch.Tensor):
                args[ia] = quantize_dequantize(a, self.cfg, dim=-1)
                args[ib] = quantize_dequantize(b, self.cfg, dim=-2)
                self.n_quantized += 1
            args = tuple(args)
        return func(*args, **kwargs)
