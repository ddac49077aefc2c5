"""load/quant/fp8.py: fp8 weights with scales — a block layout (DeepSeek-V3, 128x128 from the
config or found from the shapes, MoE per expert), per-channel and per-tensor scales; scales that fit
no layout are unchecked with the reason; NaN/Inf codes left to the plain scan."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nan_hunter.load.quant.fp8 import Fp8, fp8_codes

from .kit import checkpoint, detect, graded

E4M3 = torch.float8_e4m3fn


def _w(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 100).clamp(-448, 448).to(E4M3)


@pytest.mark.parametrize(
    "scale_shape, fmt, n_blocks",
    [
        ((3, 3), "fp8_block", 9),
        ((300, 1), "fp8_channel", 300),
        ((), "fp8_tensor", 1),
        ((1,), "fp8_tensor", 1),
    ],
)
def test_layouts(tmp_path, scale_shape, fmt, n_blocks):
    w = _w((300, 260))
    s = torch.rand(scale_shape) + 0.5 if scale_shape else torch.tensor(0.75)
    ck = checkpoint(
        tmp_path,
        {"l.weight": w, "l.weight_scale_inv" if fmt == "fp8_block" else "l.weight_scale": s},
        {"quant_method": "fp8", "weight_block_size": [128, 128]},
    )
    (r,) = graded(Fp8(), ck).values()
    assert (r.format, r.n_blocks, r.bad_blocks) == (fmt, n_blocks, [])
    if fmt == "fp8_block":
        full = s.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :260]
    else:
        full = s.reshape(-1, 1) if s.numel() > 1 else s
    assert r.dequant_absmax == pytest.approx(float((w.float() * full).abs().max()), rel=1e-6)


def test_moe_blocks_per_expert(tmp_path):
    w = _w((2, 200, 128))  # 200 rows: a partial last block per expert, never mixed with the next expert's
    s = torch.ones(2, 2, 1)
    s[1, 1, 0] = 0.0  # expert 1's partial block holds data: a zero scale there is a fault
    (r,) = graded(
        Fp8(),
        checkpoint(
            tmp_path,
            {"e.weight": w, "e.weight_scale_inv": s},
            {"quant_method": "fp8", "weight_block_size": [128, 128]},
        ),
    ).values()
    assert r.n_blocks == 4 and r.bad_blocks == [{"index": [1, 1, 0], "scale": 0.0, "problem": "zero"}]


def test_scales_that_fit_no_layout_are_unchecked(tmp_path):
    found, ctx = detect(
        Fp8(), checkpoint(tmp_path, {"l.weight": _w((10, 10)), "l.weight_scale_inv": torch.ones(3, 7)})
    )
    assert found == {} and ctx.unchecked == [
        {
            "name": "l.weight",
            "dtype": "F8_E4M3",
            "reason": "scale l.weight_scale_inv [3, 7] does not match its data [10, 10] in any "
            "known quantized format",
        }
    ]
    assert {"l.weight", "l.weight_scale_inv"} <= ctx.claimed


def test_not_fp8_data_is_left_to_other_formats(tmp_path):
    found, ctx = detect(
        Fp8(), checkpoint(tmp_path, {"l.weight": torch.ones(4, 4), "l.weight_scale": torch.ones(1)})
    )
    assert found == {} and ctx.claimed == set()


def test_nan_and_inf_codes_read_as_zero():
    m = np.array([0x7F, 0xFF, 0x7E, 0x01], dtype=np.uint8)  # e4m3: NaN, -NaN, 448, tiny
    assert fp8_codes("F8_E4M3", m).tolist() == [0, 0, 0x7E, 0x01]
    m5 = np.array([0x7C, 0x7B], dtype=np.uint8)  # e5m2: inf, 57344
    assert fp8_codes("F8_E5M2", m5).tolist() == [0, 0x7B]
    assert fp8_codes("F8_E4M3FNUZ", np.array([0x80], dtype=np.uint8)).tolist() == [0]


def test_a_nan_scale_is_named(tmp_path):
    s = torch.ones(300, 1)
    s[7, 0] = math.nan
    (r,) = graded(Fp8(), checkpoint(tmp_path, {"l.weight": _w((300, 16)), "l.weight_scale": s})).values()
    assert r.bad_blocks == [{"index": [7, 0], "scale": "nan", "problem": "nan"}] and r.faulty
