"""load/quant/nvfp4.py: fp4 pairs with an fp8 scale per 16 values and a global scale — modelopt's
``weight_scale_2`` multiplies, compressed-tensors' ``weight_global_scale`` divides; a NaN, infinite
or zero global scale is a fault of the whole weight."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.load.quant.nvfp4 import Nvfp4

from .kit import checkpoint, detect, graded

SIX = 0x77  # two fp4 values of 6


def _ck(tmp_path, global_name: str | None, global_value: float):
    t = {
        "l.weight": torch.full((4, 16), SIX, dtype=torch.uint8),  # [out, in/2]: in = 32, two blocks of 16
        "l.weight_scale": torch.full((4, 2), 2.0).to(torch.float8_e4m3fn),
    }
    if global_name:
        t[f"l.weight_{global_name}"] = torch.tensor([global_value])
    return checkpoint(tmp_path, t)


@pytest.mark.parametrize(
    "global_name, value, absmax",
    [
        ("scale_2", 0.5, 6.0),  # modelopt: 6 * 2 * 0.5
        ("global_scale", 4.0, 3.0),  # compressed-tensors: 6 * 2 / 4
        (None, 0.0, 12.0),  # fp8 scales alone
    ],
)
def test_global_scale(tmp_path, global_name, value, absmax):
    (r,) = graded(Nvfp4(), _ck(tmp_path, global_name, value)).values()
    assert (r.format, r.n_blocks, r.bad_blocks, r.dequant_absmax) == ("nvfp4", 8, [], absmax)


@pytest.mark.parametrize(
    "global_name, value, problem",
    [
        ("scale_2", math.nan, "nan"),
        ("scale_2", math.inf, "inf"),
        ("scale_2", 0.0, "zero"),
        ("global_scale", 0.0, "inf"),
    ],
)
def test_a_bad_global_scale_is_a_fault(tmp_path, global_name, value, problem):
    (r,) = graded(Nvfp4(), _ck(tmp_path, global_name, value)).values()
    assert r.faulty and r.bad_blocks[0]["index"] == [] and r.bad_blocks[0]["problem"] == problem


def test_scale_rows_must_match(tmp_path):
    found, ctx = detect(
        Nvfp4(),
        checkpoint(
            tmp_path,
            {
                "l.weight": torch.zeros(4, 16, dtype=torch.uint8),
                "l.weight_scale": torch.ones(3, 2).to(torch.float8_e4m3fn),
            },
        ),
    )
    assert found == {} and "does not match its data [4, 16]" in ctx.unchecked[0]["reason"]
