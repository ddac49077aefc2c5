"""The torch reference's CPU fast path: ``quick_row(t, underflow=True)`` gives the abs-min and the
flush-to-zero counts ``full_row`` gives, for every dtype, layout and edge case; a cast really
rounds the counted values to zero."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from nan_hunter.dtypes import HEADROOM_DTYPES, limits, torch_dtype
from nan_hunter.kernels.reference import full_row, quick_row
from nan_hunter.kernels.stats import UNDER_FIELDS, TensorStats

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2)
EXACT = ("absmax", "min_nonzero", *UNDER_FIELDS)


def _full(t: torch.Tensor) -> TensorStats:
    return TensorStats.from_row(*(x.tolist() for x in full_row(t)))


def _wide_range(n: int, zeros: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-140, 20, (n,), generator=g).float())
    if zeros:
        x[::3] = 0.0
    return x


def _edges() -> torch.Tensor:
    """Every flush limit with its fp32 neighbours, both signs, and zeros of both signs."""
    vals = [0.0, -0.0, 1.0]
    for d in HEADROOM_DTYPES:
        lim = torch.tensor(limits(d).flush, dtype=torch.float32)
        for v in (torch.nextafter(lim, torch.tensor(0.0)), lim, torch.nextafter(lim, torch.tensor(1.0))):
            vals += [float(v), -float(v)]
    return torch.tensor(vals, dtype=torch.float64)


def _cases(dtype: torch.dtype) -> list[torch.Tensor]:
    out = []
    for i, n in enumerate((1, 7, 1000, 50_000)):
        for zeros in (False, True):
            top = min(float(torch.finfo(dtype).max), 1e30)
            x = _wide_range(n, zeros, seed=10 * i + zeros).clamp(-top, top).to(dtype)
            out += [x, x[::2]]
            if n > 1:
                out.append(x.reshape(-1, 1).expand(-1, 2).t())  # a transposed broadcast view
    return [*out, _edges().to(dtype), torch.zeros(5, dtype=dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quick_row_underflow_matches_full_row(dtype):
    for t in _cases(dtype):
        got = TensorStats.from_row(*quick_row(t, underflow=True))
        want = _full(t)
        for k in EXACT:
            g, w = getattr(got, k), getattr(want, k)
            if g is None and k in ("under_e4m3", "under_e5m2"):
                continue  # fp8 flushes are counted only where none can occur (min_nonzero above the limit)
            if dtype == torch.float64 and isinstance(g, float):
                g = float(torch.tensor(g).float())  # full_row's floats are fp32
            assert g == w, (dtype, k, g, w, t.shape)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_chunks_of_the_scratch_buffer_give_the_same_row(dtype, monkeypatch):
    """Tensors longer than the reused buffer are walked chunk by chunk: zeros, the abs-min, the
    flushes and a late NaN in different chunks."""
    from nan_hunter.kernels import reference

    monkeypatch.setattr(reference, "SCRATCH", 1000)
    x = _wide_range(10_500, False, seed=5).clamp(-1e30, 1e30).to(dtype)
    x[2500:2600] = 0.0  # zeros in one chunk only
    one = TensorStats.from_row(*quick_row(x, underflow=True))
    want = _full(x)
    for k in ("absmax", "min_nonzero", "under_fp16", "under_bf16"):
        assert getattr(one, k) == getattr(want, k), k
    x[10_400] = math.nan  # in the last chunk
    assert quick_row(x, underflow=True) is None


def test_strided_view_longer_than_the_scratch_buffer(monkeypatch):
    from nan_hunter.kernels import reference

    monkeypatch.setattr(reference, "SCRATCH", 1000)
    x = _wide_range(10_000, True, seed=6)[::3]  # 1-D, not contiguous, 3334 elements
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no output resized into a slice of the scratch buffer
        got = TensorStats.from_row(*quick_row(x, underflow=True))
    want = _full(x)
    for k in ("absmax", "min_nonzero", "under_fp16", "under_bf16"):
        assert getattr(got, k) == getattr(want, k), k


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_finite_goes_to_full_row(dtype):
    x = torch.tensor([1.0, math.nan, 2.0]).to(dtype)
    assert quick_row(x, underflow=True) is None and quick_row(x) is None


def test_counts_are_what_a_cast_rounds_to_zero():
    x = torch.cat([_wide_range(20_000, True, seed=3), _edges().float()])
    quick = TensorStats.from_row(*quick_row(x, underflow=True))
    full = _full(x)
    for d in HEADROOM_DTYPES:
        cast = x.to(torch_dtype(d)).float()
        want = int(((cast == 0) & (x != 0)).sum())
        assert full.flushed(d) == want, d
        # the fast path counts the 16-bit targets; fp8's only when nothing can flush
        assert quick.flushed(d) == (want if d in ("fp16", "bf16") else None), d


def test_fp8_flush_known_without_a_pass_when_nothing_is_small():
    st = TensorStats.from_row(*quick_row(torch.tensor([0.5, -2.0, 0.0, 1.0]), underflow=True))
    assert st.flushed("fp8-e4m3") == 0 and st.flushed("fp8-e5m2") == 0


def test_without_underflow_only_the_cheap_fields():
    x = torch.randn(100)
    st = TensorStats.from_row(*quick_row(x))
    assert st.absmax == float(x.abs().max())
    assert st.min_nonzero is None and all(getattr(st, k) is None for k in UNDER_FIELDS)


def test_all_zero_tensor_has_no_abs_min():
    st = TensorStats.from_row(*quick_row(torch.zeros(10), underflow=True))
    assert st.absmax == 0.0 and st.min_nonzero == math.inf
    assert all(getattr(st, k) == 0 for k in UNDER_FIELDS)
    assert st.to_dict()["min_nonzero"] is None
