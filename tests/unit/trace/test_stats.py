"""Trace statistics against a float64 reference, and the byte hash's stability."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.trace.stats import combine, digest, tensor_crc


def _reference(t: torch.Tensor) -> dict:
    f = t.double().reshape(-1)
    fin = f[torch.isfinite(f)]
    a = fin.abs()
    nz = a[a > 0]
    return {
        "nan": int(torch.isnan(f).sum()),
        "posinf": int((f == math.inf).sum()),
        "neginf": int((f == -math.inf).sum()),
        "absmax": float(a.max()) if a.numel() else None,
        "absmin": float(nz.min()) if nz.numel() else None,
        "mean": float(fin.mean()) if fin.numel() else None,
        "l2": float(fin.norm()),
    }


@pytest.mark.parametrize(
    "name, t",
    [
        ("fp32 normal", torch.randn(1000)),
        ("bf16 2-D", torch.randn(37, 29).to(torch.bfloat16)),
        ("fp16 with zeros", torch.relu(torch.randn(4096)).half()),
        ("fp8 e4m3", torch.randn(300).to(torch.float8_e4m3fn)),
        ("fp64", torch.randn(77, dtype=torch.float64)),
        ("nan, +inf, -inf among values", torch.tensor([1.0, math.nan, math.inf, -math.inf, -3.0, 0.0])),
        ("all nan", torch.full((5,), math.nan)),
        ("all zeros", torch.zeros(9)),
        ("smallest subnormal", torch.tensor([2.0**-149, 1.0])),
        ("large values scaled before squaring", torch.tensor([3e30, -4e30])),
        ("transposed view", torch.randn(8, 5).t()),
    ],
)
def test_digest_matches_float64(name, t):
    d = digest(t)
    ref = _reference(t)
    assert (d.nan, d.posinf, d.neginf) == (ref["nan"], ref["posinf"], ref["neginf"])
    for k in ("absmax", "absmin", "mean", "l2"):
        got, want = getattr(d, k), ref[k]
        if want is None:
            assert got is None, k
        else:
            scale = max(abs(want), ref["absmax"] or 0.0) if k == "mean" else abs(want)
            assert abs(got - want) <= 1e-5 * scale + 1e-45, (k, got, want)
    assert d.shape == tuple(t.shape) and d.numel == t.numel()


def test_empty_tensor():
    d = digest(torch.empty(0, 3))
    assert d.numel == 0 and d.absmax is None and d.mean is None and d.l2 == 0.0


def test_hash_is_of_values_in_row_major_order_not_of_layout():
    x = torch.randn(6, 4)
    xt = x.t().contiguous().t()  # same values, column-major memory
    assert not xt.is_contiguous()
    assert digest(x).hash == digest(xt).hash == digest(x.clone()).hash


def test_hash_changes_with_one_bit_dtype_or_shape():
    x = torch.randn(16)
    y = x.clone()
    y.view(torch.int32)[3] ^= 1  # one mantissa bit
    assert digest(x).hash != digest(y).hash
    assert digest(x).hash != digest(x.view(4, 4)).hash
    assert digest(x).hash != digest(x.double()).hash
    assert digest(torch.tensor([0.0])).hash != digest(torch.tensor([-0.0])).hash


def test_hash_is_crc32_of_header_and_bytes():
    import zlib

    x = torch.arange(6, dtype=torch.float32).view(2, 3)
    want = zlib.crc32(x.numpy().tobytes(), zlib.crc32(b"fp32|2,3|"))
    assert tensor_crc(x) == want and digest(x).hash == f"{want:08x}"


def test_combine_adds_counts_and_sums():
    a, b = torch.tensor([1.0, -2.0]), torch.tensor([math.nan, 4.0, 0.5])
    d = combine([digest(a), digest(b)])
    assert (d.nan, d.absmax, d.absmin, d.finite_n) == (1, 4.0, 0.5, 4)
    assert d.mean == pytest.approx((1 - 2 + 4 + 0.5) / 4)
    assert d.l2 == pytest.approx(math.sqrt(1 + 4 + 16 + 0.25))
    assert combine([]) is None and combine([digest(a)]) == digest(a)
