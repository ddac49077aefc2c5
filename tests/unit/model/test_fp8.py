"""fp8 emulation: range handling never depends on torch's own float8 cast (which changed in 2.12)."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.dtypes import Fp8Recipe
from nan_hunter.model.fp8 import FP8Emulation, quantize_dequantize

E4M3, E5M2 = 448.0, 57344.0


def _grid_round(x: float, fmt: str) -> float:
    """Round-to-nearest-even onto the fp8 grid, in plain Python (in-range values only)."""
    mant, min_exp = (3, -6) if fmt == "fp8-e4m3" else (2, -14)
    if x == 0:
        return 0.0
    e = max(math.floor(math.log2(abs(x))), min_exp)
    step = 2.0 ** (e - mant)
    q = abs(x) / step
    r = math.floor(q)
    frac = q - r
    if frac > 0.5 or (frac == 0.5 and r % 2 == 1):
        r += 1
    return math.copysign(r * step, x)


@pytest.mark.parametrize("fmt,fmax", [("fp8-e4m3", E4M3), ("fp8-e5m2", E5M2)])
@pytest.mark.parametrize(
    "case,value",
    [
        ("far above max", 1e6),
        ("just above max", None),
        ("at max", "max"),
        ("inf", math.inf),
        ("below -max", -1e9),
    ],
)
def test_unscaled_overflow_policies(fmt, fmax, case, value):
    v = {None: fmax * 1.1, "max": fmax}.get(value, value) if not isinstance(value, float) else value
    x = torch.tensor([float(v), 1.0])
    sat = quantize_dequantize(x, Fp8Recipe(fmt, scaling="none", overflow="saturate"))
    assert sat[0].item() == math.copysign(fmax, float(v))  # saturate clamps, +inf included
    nf = quantize_dequantize(x, Fp8Recipe(fmt, scaling="none", overflow="nonfinite"))
    if abs(float(v)) > fmax:
        if fmt == "fp8-e4m3":
            assert math.isnan(nf[0].item())  # e4m3fn has no inf
        else:
            assert nf[0].item() == math.copysign(math.inf, float(v))
    else:
        assert nf[0].item() == fmax
    assert sat[1].item() == 1.0


@pytest.mark.parametrize("fmt", ["fp8-e4m3", "fp8-e5m2"])
def test_in_range_values_match_python_rounding(fmt):
    torch.manual_seed(0)
    x = torch.randn(2000) * 3
    got = quantize_dequantize(x, Fp8Recipe(fmt, scaling="none"))
    want = torch.tensor([_grid_round(float(v), fmt) for v in x])
    assert torch.equal(got, want)


def test_tensorwise_scaling_uses_amax_and_eps():
    x = torch.tensor([[0.0, 0.0, 0.1, 0.1]], dtype=torch.float16)
    y = quantize_dequantize(x, Fp8Recipe("fp8-e5m2"))
    assert torch.isfinite(y).all()  # the fp16 -> fp8 incident does not happen here: scale in fp64
    z = quantize_dequantize(torch.zeros(4), Fp8Recipe("fp8-e4m3"))
    assert torch.equal(z, torch.zeros(4))  # all-zero block: eps clamp, no 0/0


def test_rowwise_scaling_per_row():
    x = torch.tensor([[1000.0, 1.0], [0.001, 0.002]])
    y = quantize_dequantize(x, Fp8Recipe("fp8-e4m3", scaling="rowwise"), dim=-1)
    assert torch.allclose(y, x, rtol=0.07)  # each row scaled to its own amax keeps small rows


def test_emulation_mode_quantizes_linear_operands():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8).bfloat16()
    x = torch.randn(4, 16).bfloat16()
    with torch.no_grad():
        plain = lin(x)
        with FP8Emulation("fp8-e4m3") as mode:
            emu = lin(x)
    assert mode.n_quantized == 1
    assert not torch.equal(plain, emu)
    assert torch.allclose(plain.float(), emu.float(), atol=0.15)


def test_bad_config_rejected():
    with pytest.raises(ValueError):
        Fp8Recipe("fp8-e4m3", scaling="blockwise")
    with pytest.raises(ValueError):
        Fp8Recipe("fp16")


def test_fp8_run_mode_through_cli(cli_main):
    root = "examples/incidents/ffn_wo_overflow"
    res = cli_main(
        "scan",
        f"{root}/model.safetensors",
        "--arch",
        f"{root}/model.py:build",
        "--inputs",
        f"{root}/inputs.safetensors",
        "--dtype",
        "fp8-e4m3",
    )
    assert res.code == 0, res.stdout[-1500:]  # scaled fp8 matmul operands + bf16 compute: finite
    assert res.report["run"]["dtype"] == "fp8-e4m3"
