"""Shared pieces of the Triton kernel tests: the kernel module per mode, edge cases, the row check.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is decorated, its own library
(``tl.sum``, ``tl.cdiv``, ...) included, so the variable has to be set before triton is first
imported. On a machine without CUDA (where compiled kernels cannot run anyway) this conftest
sets it at import, before any test module imports triton; with CUDA it leaves it alone, so the
GPU tests get compiled kernels. Each test file checks the mode it got and skips otherwise.

Test functions taking a ``dtype_case`` argument are parametrized over every dtype x edge case,
with ids like ``bfloat16-subnormals``.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nan_hunter.kernels.reference import full_row  # noqa: E402
from nan_hunter.kernels.stats import FLOAT_FIELDS, INT_FIELDS, N_FLOAT, N_INT  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
_BITS_VIEW = {4: torch.int32, 2: torch.int16, 1: torch.uint8}
_FORMAT_LIMITS = tuple(float(torch.finfo(d).max) for d in DTYPES[1:])  # the over_* thresholds
# the under_* thresholds: half the smallest subnormal of each target (fp32 values)
_FLUSH_LIMITS = tuple(float(torch.finfo(d).smallest_normal * torch.finfo(d).eps) / 2 for d in DTYPES[1:])
_SEED = 20240613


def load_kernels(interpret: bool):
    """``nan_hunter.kernels.triton`` if it runs in the wanted mode (interpreted on CPU tensors,
    or compiled for CUDA), else skip the calling test."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module("nan_hunter.kernels.triton")
    interpreted = isinstance(module._stats_kernel, InterpretedFunction)
    if interpreted != interpret:
        pytest.skip(
            "needs TRITON_INTERPRET=1 set before triton is imported (run tests/kernels on a machine "
            "without CUDA, or on its own)"
            if interpret
            else "triton kernels are interpreted in this session"
        )
    return module


# ------------------------------------------------------------------------------------- cases


def from_bits(bits: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``dtype`` holding exactly the given bit patterns (unsigned ints)."""
    width = torch.finfo(dtype).bits
    signed = [b - (1 << width) if width > 8 and b >= 1 << (width - 1) else b for b in bits]
    return torch.tensor(signed, dtype=_BITS_VIEW[width // 8]).view(dtype)


def to_bits(t: torch.Tensor) -> list[int]:
    width = torch.finfo(t.dtype).bits
    return [b & ((1 << width) - 1) for b in t.view(_BITS_VIEW[width // 8]).tolist()]


def _mant_bits(dtype: torch.dtype) -> int:
    return round(-math.log2(torch.finfo(dtype).eps))


def _random(n: int):
    def build(dtype):
        g = torch.Generator().manual_seed(_SEED + n)
        # magnitudes over 2^-24..2^24: subnormals of the narrow formats, overflows of the wide ones
        scale = torch.exp2(torch.randint(-24, 24, (n,), generator=g).float())
        x = torch.randn(n, generator=g) * scale
        x[torch.rand(n, generator=g) < 0.05] = 0.0
        return x.to(dtype)

    return build


def _subnormals(dtype):
    m = _mant_bits(dtype)
    sign = 1 << (torch.finfo(dtype).bits - 1)
    mags = [1, 2, (1 << m) - 1, 1 << m, (1 << m) + 1, 0]  # smallest/largest subnormal, smallest normal
    return from_bits(mags + [b | sign for b in mags], dtype)


def _limits(dtype):
    """Every format limit this dtype can hold, rounded into it, with its bit neighbours: values
    exactly at the limit, just above it (for the dtype's own max: Inf, or NaN for e4m3fn), below."""
    top = torch.finfo(dtype).max
    bits = []
    for lim in (*_FORMAT_LIMITS, top):
        if lim <= top:
            b = to_bits(torch.tensor([lim]).to(dtype))[0]
            bits += [b - 1, b, b + 1]
    sign = 1 << (torch.finfo(dtype).bits - 1)
    return from_bits(bits + [b | sign for b in bits], dtype)


def _flush_limits(dtype):
    """Every flush-to-zero limit this dtype can hold, with its bit neighbours (values at the
    limit tie to zero, one step above round to the smallest subnormal), both signs; zeros."""
    bits = []
    for lim in _FLUSH_LIMITS:
        v = torch.tensor([lim], dtype=torch.float64).to(torch.float32).to(dtype)
        if float(v) == lim:
            b = to_bits(v)[0]
            bits += [b - 1, b, b + 1]
    sign = 1 << (torch.finfo(dtype).bits - 1)
    return from_bits(bits + [b | sign for b in bits] + [0, sign], dtype)


def _inf_mix(dtype):
    x = torch.arange(1.0, 41.0)
    x[13], x[20], x[21], x[30], x[39] = math.inf, -math.inf, math.nan, math.inf, -math.inf
    return x.to(dtype)


def _late_nonfinite(dtype):
    g = torch.Generator().manual_seed(_SEED)
    x = torch.randn(5000, generator=g)
    x[4500], x[4999], x[4700] = -math.inf, math.nan, math.inf
    return x.to(dtype)


CASES = {
    **{f"random-{n}": _random(n) for n in (1, 7, 1023, 4097, 100003)},
    "empty": lambda dtype: torch.empty(0, dtype=dtype),
    "all-nan": lambda dtype: torch.full((37,), math.nan).to(dtype),
    "inf-mix": _inf_mix,
    "late-nonfinite": _late_nonfinite,
    "subnormals": _subnormals,
    "limits-at-and-above": _limits,
    "flush-limits": _flush_limits,
    "signed-zeros": lambda dtype: torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0, -1.0]).to(dtype),
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pytest_generate_tests(metafunc):
    if "dtype_case" in metafunc.fixturenames:
        params = [(d, c) for d in DTYPES for c in CASES]
        metafunc.parametrize("dtype_case", params, ids=[f"{dtype_name(d)}-{c}" for d, c in params])


def build_case(dtype_case, device="cpu") -> torch.Tensor:
    dtype, case = dtype_case
    return CASES[case](dtype).to(device)


# ------------------------------------------------------------------------------------ checks


def garbage_buffers(cap: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stats buffers pre-filled with values no row may keep: the kernel must initialise its rows."""
    ints = torch.full((cap, N_INT), 1234567, dtype=torch.int64, device=device)
    floats = torch.full((cap, N_FLOAT), -777.0, dtype=torch.float32, device=device)
    return ints, floats


def assert_row_matches(t: torch.Tensor, ints_row: torch.Tensor, floats_row: torch.Tensor) -> None:
    """Counts, first_nonfinite, absmax and min_nonzero exactly; sum/sumsq within fp32 rounding."""
    ref_i, ref_f = full_row(t)
    got = dict(zip(INT_FIELDS, ints_row.tolist()))
    want = dict(zip(INT_FIELDS, ref_i.tolist()))
    assert got == want, {k: (got[k], want[k]) for k in INT_FIELDS if got[k] != want[k]}
    got_f = dict(zip(FLOAT_FIELDS, floats_row.tolist()))
    want_f = dict(zip(FLOAT_FIELDS, ref_f.tolist()))
    for k in ("absmax", "min_nonzero"):
        assert got_f[k] == want_f[k], (k, got_f[k], want_f[k])
    # fp32 accumulation in a different order: the error scales with sum |x|, not with |sum x|
    x = t.detach().cpu().to(torch.float64).reshape(-1)
    x = x[torch.isfinite(x)]
    for k, scale in (("sum", x.abs().sum().item()), ("sumsq", (x * x).sum().item())):
        g, w = got_f[k], want_f[k]
        if k == "sum" and scale > torch.finfo(torch.float32).max:
            continue  # whether +max + max overflows before -max comes in depends on the order
        if not (math.isfinite(w) and math.isfinite(g)):
            assert g == w or (math.isnan(g) and math.isnan(w)), (k, g, w)
        else:
            assert abs(g - w) <= 1e-4 * abs(w) + 1e-5 * scale, (k, g, w)


@pytest.fixture(scope="session")
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (importing ``conftest`` by name is ambiguous)."""
    return SimpleNamespace(
        load_kernels=load_kernels,
        build_case=build_case,
        from_bits=from_bits,
        to_bits=to_bits,
        garbage_buffers=garbage_buffers,
        assert_row_matches=assert_row_matches,
        cases=CASES,
        dtypes=DTYPES,
    )
