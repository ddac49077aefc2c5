"""load/quant/base.py: what every format shares — rows and columns of a stored weight, elements per
block from the scale count, flat index → scale index, scale tensors as float32 (E8M0 decoded, 0xFF
NaN), which bad blocks are faults, and the Context formats claim tensors through."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.load.quant.base import (
    FP8_TAGS,
    QuantizedScan,
    block_of,
    is_fault,
    rows_cols,
    scale_values,
    unravel,
)

from .kit import checkpoint, context


@pytest.mark.parametrize("shape, rc", [([], (1, 1)), ([7], (1, 7)), ([3, 5], (3, 5)), ([2, 3, 5], (6, 5))])
def test_rows_cols(shape, rc):
    assert rows_cols(shape) == rc


@pytest.mark.parametrize("n, n_scales, given, block", [
    (256, 2, 128, 128),  # as the config says
    (260, 3, 128, 128),  # a partial last block
    (256, 2, None, 128),  # a power of two found
    (300, 3, None, 128),  # the smallest power of two giving 3 blocks
    (96, 3, None, 32),
    (90, 3, None, 32),  # 32 + 32 + 26
    (90, 5, None, 18),  # no power of two gives 5: an even split
    (100, 3, None, None),  # none fits
    (256, 3, 128, None),  # the config's block does not give 3 and nothing else fits
    (256, 0, None, None),  # no scales
])
def test_block_of(n, n_scales, given, block):
    assert block_of(n, n_scales, given) == block


@pytest.mark.parametrize("flat, shape, index", [(0, [2, 3], [0, 0]), (5, [2, 3], [1, 2]), (7, [2, 2, 2], [1, 1, 1]),
                                                (3, [4], [3]), (0, [0, 3], [0, 0])])
def test_unravel(flat, shape, index):
    assert unravel(flat, shape) == index


def test_scale_values(tmp_path):
    e8m0 = torch.tensor([[127, 128], [0, 0xFF]], dtype=torch.uint8)
    ck = checkpoint(tmp_path, {"f16": torch.tensor([[1.5, -2.0]], dtype=torch.float16), "e": e8m0,
                               "native": e8m0.clone().view(torch.float8_e8m0fnu)})
    assert scale_values(ck, "f16").tolist() == [1.5, -2.0] and scale_values(ck, "f16").dtype == torch.float32
    assert scale_values(ck, "e").tolist() == [127.0, 128.0, 0.0, 255.0]  # plain bytes unless told
    for name, flag in (("e", True), ("native", False)):
        v = scale_values(ck, name, e8m0=flag)
        assert v[:3].tolist() == [1.0, 2.0, 2.0 ** -127] and math.isnan(v[3])


@pytest.mark.parametrize("fmt, problem, fault", [
    ("fp8_block", "nan", True), ("fp8_block", "zero", True), ("gptq", "negative", False),
    ("scale", "negative", True),  # an activation or KV scale has no sign convention
])
def test_is_fault(fmt, problem, fault):
    assert is_fault({"format": fmt}, {"problem": problem}) is fault


def test_quantized_scan():
    r = QuantizedScan("l.weight", "fp8_block", "l.weight_scale_inv", 9, n_faults=0)
    assert not r.faulty and r.to_dict() == {"name": "l.weight", "format": "fp8_block", "scale": "l.weight_scale_inv",
                                            "n_blocks": 9, "bad_blocks": [], "n_bad": 0, "dequant_absmax": None,
                                            "overflows": {}}
    r.n_faults = 1
    assert r.faulty


def test_context_claims_and_skips(tmp_path):
    ck = checkpoint(tmp_path, {"a.weight": torch.ones(2, 3).to(torch.float8_e4m3fn), "a.weight_scale": torch.ones(1),
                               "b": torch.ones(1)})
    ctx = context(ck)
    assert ctx.tag("a.weight") in FP8_TAGS and ctx.shape("a.weight") == [2, 3] and ctx.qc == {}
    assert ctx.free("a.weight") and not ctx.free("missing")
    ctx.claim("a.weight", None)
    assert not ctx.free("a.weight")
    ctx.skip("b", "F32", "why not", "a.weight_scale")
    assert ctx.unchecked == [{"name": "b", "dtype": "F32", "reason": "why not"}]
    assert ctx.claimed == {"a.weight", "a.weight_scale", "b"}
