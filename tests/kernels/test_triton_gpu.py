"""The Triton stats kernel compiled for CUDA, against ``full_row`` on the same device.

Same edge cases as the interpreter tests (the compiled bit twiddling is what runs in production),
plus what only a GPU can show: more than 2^31 elements, and no host synchronisation.
"""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.kernels.stats import INT_FIELDS

pytest.importorskip("triton")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = "cuda"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture(scope="module")
def tk(kit):
    return kit.load_kernels(interpret=False)


def _one_row(tk, kit, t, **kw):
    ints, floats = kit.garbage_buffers(3, t.device)
    tk.stats_into(t, ints, floats, 1, **kw)
    assert (ints[[0, 2]] == 1234567).all() and (floats[[0, 2]] == -777.0).all()
    return ints[1], floats[1]


@pytest.mark.parametrize(
    "launch",
    [{}, {"block_size": 128}, {"block_size": 64, "max_programs": 3}],
    ids=["default-blocks", "small-blocks", "many-blocks-per-program"],
)
def test_matches_reference(tk, kit, dtype_case, launch):
    t = kit.build_case(dtype_case, CUDA)
    kit.assert_row_matches(t, *_one_row(tk, kit, t, **launch))


def _views(dtype):
    g = torch.Generator().manual_seed(7)
    base = torch.randn(480, 333, generator=g)
    base[50, 7], base[3, 200] = math.nan, math.inf
    cube = torch.randn(4, 80, 33, generator=g)
    cube[2, 1, 3] = -math.inf
    base, cube = base.to(CUDA, dtype), cube.to(CUDA, dtype)
    return {
        "column-slice": base[:, 1:300],
        "every-other-row": base[::2],
        "strided-1d": base.reshape(-1)[::3],
        "3d-last-dim-slice": cube[:, :, 2:22],
        "single-column": base[:, 7],
        "broadcast-rows": base[0].expand(50, 333),
        "transposed-copied": base.t(),
        "unaligned-base": base.reshape(-1)[1:],
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8], ids=str)
def test_views(tk, kit, dtype):
    for name, t in _views(dtype).items():
        ints, floats = _one_row(tk, kit, t)
        try:
            kit.assert_row_matches(t, ints, floats)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_every_fp8_bit_pattern(tk, kit, dtype):
    runs = [kit.from_bits(list(range(b, b + 8)), dtype).to(CUDA) for b in range(0, 256, 8)]
    ints, floats = kit.garbage_buffers(32, CUDA)
    tk.stats_many_into(runs, ints, floats, list(range(32)))
    for r, t in enumerate(runs):
        kit.assert_row_matches(t, ints[r], floats[r])
        x = t.double()
        assert floats[r, 2].item() == x[torch.isfinite(x)].sum().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_16bit_pattern(tk, kit, dtype):
    t = kit.from_bits(list(range(1 << 16)), dtype).to(CUDA)
    kit.assert_row_matches(t, *_one_row(tk, kit, t))


def test_stats_many_into_mixed(tk, kit):
    g = torch.Generator().manual_seed(3)
    big = (torch.randn(300_001, generator=g) * 1e3).to(CUDA)
    big[299_999] = math.nan
    tensors = [
        big,
        big.to(torch.bfloat16),
        big[1:],  # unaligned base: its own launch
        torch.empty(0, dtype=torch.float16, device=CUDA),
        kit.build_case((torch.float8_e4m3fn, "inf-mix"), CUDA),
        kit.build_case((torch.float8_e5m2, "subnormals"), CUDA),
        kit.build_case((torch.float16, "limits-at-and-above"), CUDA),
        torch.randn(400, 33, generator=g).to(CUDA, torch.float16)[:, 3:19],
        torch.full((5,), math.nan, device=CUDA),
        big.to(torch.float8_e5m2),
    ]
    rows = [7, 0, 5, 2, 9, 1, 4, 3, 8, 6]
    for launch in ({}, {"block_size": 256, "max_programs": 7}):
        ints, floats = kit.garbage_buffers(11, CUDA)
        tk.stats_many_into(tensors, ints, floats, rows, **launch)
        for t, r in zip(tensors, rows):
            kit.assert_row_matches(t, ints[r], floats[r])
        assert (ints[10] == 1234567).all()


def test_no_host_sync(tk, kit):
    """Neither launcher synchronises: sync debug mode "error" raises on any stream sync."""
    x = torch.randn(4099, device=CUDA)
    x[17] = math.nan
    tensors = [x, x.to(torch.bfloat16), x.to(torch.float8_e4m3fn), x.view(-1)[1:], x[:4096].view(64, 64).t()]
    ints, floats = kit.garbage_buffers(len(tensors) + 1, CUDA)
    # warm up: compiling and loading the kernels is not what is under test
    tk.stats_into(x, ints, floats, 0)
    tk.stats_many_into(tensors, ints, floats, list(range(1, len(tensors) + 1)))
    torch.cuda.synchronize()
    ints.fill_(1234567)
    torch.cuda.set_sync_debug_mode("error")
    try:
        tk.stats_into(x, ints, floats, 0)
        tk.stats_many_into(tensors, ints, floats, list(range(1, len(tensors) + 1)))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    kit.assert_row_matches(x, ints[0], floats[0])
    for r, t in enumerate(tensors, start=1):
        kit.assert_row_matches(t, ints[r], floats[r])


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype, nan_bits, three_bits, minus_two_bits",
    [(torch.float8_e4m3fn, 0x7F, 0x44, 0xC0), (torch.bfloat16, 0x7FC0, 0x4040, 0xC000)],
    ids=["float8_e4m3fn", "bfloat16"],
)
def test_more_than_2_31_elements(tk, kit, dtype, nan_bits, three_bits, minus_two_bits):
    """Offsets past 2^31 elements (and bytes): counts, the first NaN's index and sums still right."""
    n = 2**31 + 4097
    width = torch.finfo(dtype).bits // 8
    free, _ = torch.cuda.mem_get_info()
    if free < n * width + (1 << 30):
        pytest.skip(f"needs {n * width / 2**30:.1f} GiB free on the GPU, {free / 2**30:.1f} GiB free")
    bits_dtype = torch.uint8 if width == 1 else torch.int16
    x = torch.zeros(n, dtype=bits_dtype, device=CUDA)
    late = 2**31 + 5
    x[7] = minus_two_bits if width == 1 else minus_two_bits - (1 << 16)
    x[late + 95] = three_bits
    x[late] = nan_bits
    x[n - 1] = nan_bits
    t = x.view(dtype)
    assert t[7].item() == -2.0 and t[late + 95].item() == 3.0 and math.isnan(t[late].item())
    ints, floats = _one_row(tk, kit, t)
    got = dict(zip(INT_FIELDS, ints.tolist()))
    want = dict.fromkeys(INT_FIELDS, 0) | {"numel": n, "nan": 2, "zero": n - 4, "first_nonfinite": late}
    assert got == want
    assert floats.tolist() == [3.0, 2.0, 1.0, 13.0]
    del x, t
    torch.cuda.empty_cache()
