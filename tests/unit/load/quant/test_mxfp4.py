"""load/quant/mxfp4.py: 32 fp4 values per block with an E8M0 exponent — gpt-oss ``_blocks``/``_scales``,
compressed-tensors ``weight_packed``/``weight_scale``; shapes that do not match are unchecked; the
windows give each block's largest |fp4 value| from its bytes' nibble pairs (low nibble first)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nan_hunter.load.quant import grid
from nan_hunter.load.quant.base import QuantizedWeight
from nan_hunter.load.quant.mxfp4 import Fp4Layout, Mxfp4, fp4_codes, fp4_window

from .kit import checkpoint, detect, graded

F4 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _values(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([F4[(packed & 15).long()], F4[(packed >> 4).long()]], -1).reshape(
        *packed.shape[:-1], -1
    )


def test_gpt_oss_layout(tmp_path):
    blocks = torch.randint(0, 256, (2, 3, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    scales = torch.tensor([[127, 128, 126], [130, 0xFF, 127]], dtype=torch.uint8)
    (r,) = graded(Mxfp4(), checkpoint(tmp_path, {"m.proj_blocks": blocks, "m.proj_scales": scales})).values()
    sc = torch.pow(2.0, scales.float() - 127)
    sc[scales == 0xFF] = math.nan
    want = (_values(blocks) * sc.unsqueeze(-1)).nan_to_num(0).abs().max()
    assert (r.format, r.n_blocks) == ("mxfp4", 6)
    assert r.bad_blocks == [{"index": [1, 1], "scale": "nan", "problem": "nan"}]
    assert r.dequant_absmax == float(want)


def test_compressed_tensors_layout(tmp_path):
    packed = torch.full((4, 32), 0x77, dtype=torch.uint8)  # [out, in/2]: every value 6
    scale = torch.full((4, 2), 129, dtype=torch.uint8)  # in/32 exponents of 2**2
    (r,) = graded(
        Mxfp4(), checkpoint(tmp_path, {"l.weight_packed": packed, "l.weight_scale": scale})
    ).values()
    assert (r.format, r.n_blocks, r.dequant_absmax) == ("mxfp4", 8, 24.0)


def test_blocks_and_scales_that_disagree(tmp_path):
    found, ctx = detect(
        Mxfp4(),
        checkpoint(
            tmp_path,
            {
                "m.p_blocks": torch.zeros(2, 3, 16, dtype=torch.uint8),
                "m.p_scales": torch.zeros(2, 4, dtype=torch.uint8),
            },
        ),
    )
    assert found == {} and ctx.unchecked[0]["reason"] == "mxfp4 blocks [2, 3, 16] do not match scales [2, 4]"


def test_a_global_scale_is_nvfp4s_not_mxfp4s(tmp_path):
    ck = checkpoint(
        tmp_path,
        {
            "l.weight_packed": torch.zeros(4, 16, dtype=torch.uint8),
            "l.weight_scale": torch.zeros(4, 1, dtype=torch.uint8),
            "l.weight_global_scale": torch.ones(1),
        },
    )
    assert detect(Mxfp4(), ck)[0] == {}


@pytest.mark.parametrize("byte, mag", [(0x00, 0), (0x71, 7), (0x17, 7), (0xF9, 7), (0x21, 2), (0x88, 0)])
def test_fp4_codes_are_the_larger_nibble_magnitude(byte, mag):
    """Low nibble first; the sign bit (8) does not count: 0x88 is -0 and -0."""
    assert fp4_codes(np.array([[byte]], dtype=np.uint8), 0).tolist() == [[mag]]


@pytest.mark.parametrize("values_per_block, want", [(2, [6.0, 0.0, 6.0, 0.5]), (4, [6.0, 6.0])])
def test_fp4_window_gives_each_blocks_largest_value(tmp_path, values_per_block, want):
    # bytes: low nibble first; 0x7 is 6, 0xF is -6, 0x1 is 0.5
    m = torch.tensor([[0x71, 0x00], [0x1F, 0x11]], dtype=torch.uint8)
    g = grid.Grid(1, 2, 2, 1, 2, values_per_block // 2)  # one row a block, bytes as units
    q = QuantizedWeight("w", "mxfp4", "s", Mxfp4(), Fp4Layout(g, (2, 4 // values_per_block)))
    out = {}
    for idx, vals in fp4_window(checkpoint(tmp_path, {"w": m}), q, 0, g.n_stripes):
        assert vals.dtype == np.float32
        out.update(zip(idx.tolist(), vals.tolist()))
    assert out == dict(enumerate(want))
