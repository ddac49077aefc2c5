"""load/quant/base.py: what every format shares — rows and columns of a stored weight, elements per
block from the scale count, flat index → scale index, scale tensors as float32 (each tag's raw array
decoded as torch's cast to float32 gives it, E8M0 exponents decoded, 0xFF NaN), which bad blocks are
faults, and the Context formats claim tensors through."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nan_hunter.load.quant.base import (
    FP8_TAGS,
    QuantizedScan,
    block_of,
    e8m0_values,
    float32_values,
    is_fault,
    rows_cols,
    scale_values,
    unravel,
)
from nan_hunter.load.safetensors_header import NUMPY_DTYPES

from .kit import checkpoint, context


@pytest.mark.parametrize("shape, rc", [([], (1, 1)), ([7], (1, 7)), ([3, 5], (3, 5)), ([2, 3, 5], (6, 5))])
def test_rows_cols(shape, rc):
    assert rows_cols(shape) == rc


@pytest.mark.parametrize(
    "n, n_scales, given, block",
    [
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
    ],
)
def test_block_of(n, n_scales, given, block):
    assert block_of(n, n_scales, given) == block


@pytest.mark.parametrize(
    "flat, shape, index",
    [(0, [2, 3], [0, 0]), (5, [2, 3], [1, 2]), (7, [2, 2, 2], [1, 1, 1]), (3, [4], [3]), (0, [0, 3], [0, 0])],
)
def test_unravel(flat, shape, index):
    assert unravel(flat, shape) == index


def test_scale_values(tmp_path):
    e8m0 = torch.tensor([[127, 128], [0, 0xFF]], dtype=torch.uint8)
    ck = checkpoint(
        tmp_path,
        {
            "f16": torch.tensor([[1.5, -2.0]], dtype=torch.float16),
            "e": e8m0,
            "native": e8m0.clone().view(torch.float8_e8m0fnu),
        },
    )
    assert scale_values(ck, "f16").tolist() == [1.5, -2.0] and scale_values(ck, "f16").dtype == np.float32
    assert scale_values(ck, "e").tolist() == [127.0, 128.0, 0.0, 255.0]  # plain bytes unless told
    for name, flag in (("e", True), ("native", False)):
        v = scale_values(ck, name, e8m0=flag)
        assert v[:3].tolist() == [1.0, 2.0, 2.0**-127] and math.isnan(v[3])


def _raw(t: torch.Tensor, tag: str) -> np.ndarray:
    """``t``'s bytes as ``Checkpoint.array`` gives a tensor of ``tag`` (BF16 and fp8 as their bits)."""
    return t.contiguous().view(torch.uint8).numpy().view(NUMPY_DTYPES[tag]).reshape(t.shape)


_EDGES = [0.0, -0.0, 1.5, -2.0, 1e-3, 65504.0, 3.0e38, -1e-40, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize(
    "tag, dtype",
    [
        ("F64", torch.float64),
        ("F32", torch.float32),
        ("F16", torch.float16),
        ("BF16", torch.bfloat16),
        ("F8_E4M3", torch.float8_e4m3fn),
        ("F8_E5M2", torch.float8_e5m2),
        ("F8_E4M3FNUZ", torch.float8_e4m3fnuz),
        ("F8_E5M2FNUZ", torch.float8_e5m2fnuz),
    ],
)
def test_float32_values_are_torchs_cast(tag, dtype):
    t = (
        torch.tensor(
            _EDGES + [1e300, -1e300, 1 + 2**-30] if dtype == torch.float64 else _EDGES, dtype=torch.float64
        )
        .to(dtype)
        .reshape(-1, 1)
    )
    got = float32_values(tag, _raw(t, tag))
    want = t.to(torch.float32).reshape(-1).numpy()  # torch's cast as the reference (F64 past float32: inf)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))


def test_float32_values_of_exponent_and_integer_bytes():
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e8m0fnu).to(torch.float32).numpy()  # torch's E8M0: 2**(b - 127), 0xFF NaN
    for tag, e8m0 in (("F8_E8M0", False), ("U8", True)):
        got = float32_values(tag, codes.numpy(), e8m0=e8m0)
        assert got.dtype == np.float32 and np.array_equal(got, want, equal_nan=True)
    assert float32_values("U8", codes.numpy()).tolist() == list(range(256))  # plain bytes unless told
    assert float32_values("I8", np.array([[-128, 127]], dtype=np.int8)).tolist() == [-128.0, 127.0]


def test_e8m0_values_with_either_bias():
    codes = np.array([0, 1, 126, 127, 128, 254, 255], dtype=np.uint8)
    for bias in (127, 128):  # 127: OCP MX scales; 128: ggml's GGML_E8M0_TO_FP32_HALF
        got = e8m0_values(codes, bias)
        assert got.dtype == np.float32
        assert got[:6].tolist() == [2.0 ** (c - bias) for c in codes[:6].tolist()] and math.isnan(got[6])
    assert e8m0_values(np.array([[0, 0xFF]], dtype=np.uint8), 127).shape == (1, 2)


@pytest.mark.parametrize(
    "fmt, problem, fault",
    [
        ("fp8_block", "nan", True),
        ("fp8_block", "zero", True),
        ("gptq", "negative", False),
        ("scale", "negative", True),  # an activation or KV scale has no sign convention
    ],
)
def test_is_fault(fmt, problem, fault):
    assert is_fault({"format": fmt}, {"problem": problem}) is fault


def test_quantized_scan():
    r = QuantizedScan("l.weight", "fp8_block", "l.weight_scale_inv", 9, n_faults=0)
    assert not r.faulty and r.to_dict() == {
        "name": "l.weight",
        "format": "fp8_block",
        "scale": "l.weight_scale_inv",
        "n_blocks": 9,
        "bad_blocks": [],
        "n_bad": 0,
        "dequant_absmax": None,
        "dequant_nonfinite": 0,
        "overflows": {},
    }
    r.n_faults = 1
    assert r.faulty


def test_context_claims_and_skips(tmp_path):
    ck = checkpoint(
        tmp_path,
        {
            "a.weight": torch.ones(2, 3).to(torch.float8_e4m3fn),
            "a.weight_scale": torch.ones(1),
            "b": torch.ones(1),
        },
    )
    ctx = context(ck)
    assert ctx.tag("a.weight") in FP8_TAGS and ctx.shape("a.weight") == [2, 3] and ctx.qc == {}
    assert ctx.free("a.weight") and not ctx.free("missing")
    ctx.claim("a.weight", None)
    assert not ctx.free("a.weight")
    ctx.skip("b", "F32", "why not", "a.weight_scale")
    assert ctx.unchecked == [{"name": "b", "dtype": "F32", "reason": "why not"}]
    assert ctx.claimed == {"a.weight", "a.weight_scale", "b"}
