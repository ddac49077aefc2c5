"""The Triton stats kernel under ``TRITON_INTERPRET=1`` on CPU tensors, against ``full_row``.

Runs without a GPU. The interpreter executes programs one after another in numpy, so block sizes
are chosen to keep the program count small while most cases still span several programs, which
is what exercises the atomics and the row initialisation.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

# numpy, running the interpreted kernel, warns where fp32 x * x overflows to inf, as intended
pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
WIDE = (torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def tk(kit):
    return kit.load_kernels(interpret=True)


def _block_for(n: int) -> int:
    return 512 if n <= 8192 else 8192


def _one_row(tk, kit, t, **kw):
    ints, floats = kit.garbage_buffers(3, t.device)
    tk.stats_into(t, ints, floats, 1, **kw)
    # rows not asked for stay untouched
    assert (ints[[0, 2]] == 1234567).all() and (floats[[0, 2]] == -777.0).all()
    return ints[1], floats[1]


def test_matches_reference(tk, kit, dtype_case):
    t = kit.build_case(dtype_case)
    kit.assert_row_matches(t, *_one_row(tk, kit, t, block_size=_block_for(t.numel())))


@pytest.mark.parametrize(
    "n, block, max_programs",
    [(4097, 128, 3), (4097, 256, 1), (1023, 64, 4)],
    ids=["33-blocks-in-3-programs", "17-blocks-in-1-program", "16-blocks-in-4-programs"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e5m2], ids=str)
def test_programs_loop_over_blocks(tk, kit, n, block, max_programs, dtype):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 100
    x[n - 3], x[n // 2], x[n // 2 + 1] = math.nan, -math.inf, math.nan
    x = x.to(dtype)
    kit.assert_row_matches(x, *_one_row(tk, kit, x, block_size=block, max_programs=max_programs))


def _views():
    g = torch.Generator().manual_seed(7)
    base = torch.randn(48, 33, generator=g)
    base[5, 7] = math.nan  # inside some views, outside others (every-other-row skips row 5)
    base[3, 20] = math.inf
    cube = torch.randn(4, 8, 33, generator=g)
    cube[2, 1, 3] = -math.inf
    return {
        "column-slice": lambda d: base.to(d)[:, 1:30],
        "every-other-row": lambda d: base.to(d)[::2],
        "strided-1d": lambda d: base.to(d).reshape(-1)[::3],
        "3d-last-dim-slice": lambda d: cube.to(d)[:, :, 2:22],
        "single-column": lambda d: base.to(d)[:, 7],
        "broadcast-rows": lambda d: base[0].to(d).expand(5, 33),
        "transposed-copied": lambda d: base.to(d).t(),
        "permuted-copied": lambda d: cube.to(d).permute(2, 0, 1),
    }


VIEWS = _views()


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float8_e4m3fn], ids=str)
def test_non_contiguous(tk, kit, view, dtype):
    t = VIEWS[view](dtype)
    assert not t.is_contiguous()
    kit.assert_row_matches(t, *_one_row(tk, kit, t, block_size=128))


def test_strided_views_are_read_in_place(tk):
    """Only views with no single row stride are copied."""
    x = torch.randn(48, 33)
    for t in (x[:, 1:30], x[::2], x.reshape(-1)[::3], x[0].expand(5, 33)):
        assert tk._describe(t)[1] is t
    assert tk._describe(x.t())[1] is not x.t()


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_every_fp8_bit_pattern(tk, kit, dtype):
    everything = kit.from_bits(list(range(256)), dtype)
    kit.assert_row_matches(everything, *_one_row(tk, kit, everything, block_size=64))
    # 32 runs of 8 neighbouring patterns (one or two binades each): their fp32 sum is exact in
    # any order, so each row's sum pins down the decoded values, not only the reference's
    runs = [kit.from_bits(list(range(b, b + 8)), dtype) for b in range(0, 256, 8)]
    ints, floats = kit.garbage_buffers(32, "cpu")
    rows = [(5 * i) % 32 for i in range(32)]  # a scrambled order
    tk.stats_many_into(runs, ints, floats, rows)
    for t, r in zip(runs, rows):
        kit.assert_row_matches(t, ints[r], floats[r])
        x = t.double()
        assert floats[r, 2].item() == x[torch.isfinite(x)].sum().item()


@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_every_16bit_pattern(tk, kit, dtype):
    t = kit.from_bits(list(range(1 << 16)), dtype)
    kit.assert_row_matches(t, *_one_row(tk, kit, t, block_size=8192))
    # positive normals up to 2^15, below any fp32 overflow: no cancellation, so the sum pins
    # down the decoding of the large values
    pos = t[: int((t[: 1 << 15].float() < 2**15).sum())]
    ints, floats = _one_row(tk, kit, pos, block_size=8192)
    assert floats[2].item() == pytest.approx(pos.double().sum().item(), rel=1e-6)


def test_stats_many_into_mixed(tk, kit):
    g = torch.Generator().manual_seed(3)
    big = torch.randn(3000, generator=g) * 1e3
    big[2999] = math.nan
    tensors = [
        big,
        big.to(torch.bfloat16),
        big[1:],  # base 4 bytes past a 16-byte boundary: the unaligned launch
        torch.empty(0, dtype=torch.float16),
        kit.build_case((torch.float8_e4m3fn, "inf-mix")),
        kit.build_case((torch.float8_e5m2, "subnormals")),
        kit.build_case((torch.float16, "limits-at-and-above")),
        torch.randn(40, 33, generator=g).to(torch.float16)[:, 3:19],
        torch.full((5,), math.nan),
        torch.randn(1, generator=g).to(torch.float8_e5m2),
    ]
    assert tensors[2].data_ptr() % 16 != 0
    rows = [7, 0, 5, 2, 9, 1, 4, 3, 8, 6]
    for max_programs in (4096, 3):  # one block per program, then many blocks per program
        ints, floats = kit.garbage_buffers(11, "cpu")
        tk.stats_many_into(tensors, ints, floats, rows, block_size=128, max_programs=max_programs)
        for t, r in zip(tensors, rows):
            kit.assert_row_matches(t, ints[r], floats[r])
        assert (ints[10] == 1234567).all() and (floats[10] == -777.0).all()


def test_stats_many_into_empty_list_is_a_no_op(tk, kit):
    ints, floats = kit.garbage_buffers(2, "cpu")
    tk.stats_many_into([], ints, floats, [])
    assert (ints == 1234567).all()


def test_row_is_reinitialised_on_reuse(tk, kit):
    ints, floats = kit.garbage_buffers(1, "cpu")
    bad = torch.full((9,), math.nan)
    good = torch.ones(4)
    tk.stats_into(bad, ints, floats, 0)
    tk.stats_into(good, ints, floats, 0)
    kit.assert_row_matches(good, ints[0], floats[0])


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda tk, i, f: tk.stats_into(torch.zeros(3, dtype=torch.float64), i, f, 0), TypeError),
        (lambda tk, i, f: tk.stats_into(torch.zeros(3), i, f, 2), IndexError),
        (lambda tk, i, f: tk.stats_into(torch.zeros(3), i.float(), f, 0), ValueError),
        (lambda tk, i, f: tk.stats_into(torch.zeros(3), i, f[:, :2], 0), ValueError),
        (lambda tk, i, f: tk.stats_many_into([torch.zeros(3)] * 2, i, f, [1, 1]), ValueError),
        (lambda tk, i, f: tk.stats_many_into([torch.zeros(3)], i, f, [0, 1]), ValueError),
    ],
    ids=[
        "float64",
        "row-out-of-range",
        "ints-not-int64",
        "floats-too-narrow",
        "shared-row",
        "length-mismatch",
    ],
)
def test_rejects_bad_arguments(tk, kit, call, error):
    ints, floats = kit.garbage_buffers(2, "cpu")
    with pytest.raises(error):
        call(tk, ints, floats)


def _mixed_for_each(kit):
    g = torch.Generator().manual_seed(11)
    big = torch.randn(3000, generator=g) * 1e3
    big[1234] = math.inf
    return [
        big,
        big[1:],  # unaligned base
        torch.empty(0, dtype=torch.bfloat16),
        big.to(torch.float16)[::3],  # strided line
        kit.build_case((torch.float8_e4m3fn, "inf-mix")),
        torch.randn(30, 20, generator=g).t(),  # transposed: copied first
    ]


def test_stats_each_into_matches_reference(tk, kit):
    """The per-tensor launcher (used inside CUDA-graph capture) writes rows row0 .. row0 + n - 1
    and nothing else, with the same statistics as the pointer table."""
    tensors = _mixed_for_each(kit)
    ints, floats = kit.garbage_buffers(len(tensors) + 3, "cpu")
    tk.stats_each_into(tensors, ints, floats, 2, block_size=256, max_programs=5)
    for i, t in enumerate(tensors):
        kit.assert_row_matches(t, ints[2 + i], floats[2 + i])
    untouched = [0, 1, len(tensors) + 2]
    assert (ints[untouched] == 1234567).all() and (floats[untouched] == -777.0).all()


def test_stats_each_into_rewrites_rows_like_a_graph_replay(tk, kit):
    """Running the same launches again over other values (what a CUDA-graph replay does) leaves
    exactly the new values' statistics: the rows are re-initialised, not accumulated."""
    x = torch.full((700,), math.nan)
    y = torch.full((700,), 70000.0)
    ints, floats = kit.garbage_buffers(2, "cpu")
    tk.stats_each_into([x, y], ints, floats, 0, block_size=128)
    x.copy_(torch.linspace(-1, 1, 700))
    y.fill_(2.0)
    tk.stats_each_into([x, y], ints, floats, 0, block_size=128)
    kit.assert_row_matches(x, ints[0], floats[0])
    kit.assert_row_matches(y, ints[1], floats[1])


def test_buffers_may_be_column_ranges_of_one_block(tk, kit):
    """The sink's layout: ints and floats are column ranges of one int64 block (row stride 13)."""
    from nan_hunter.capture.sink import Segment

    seg = Segment.new(0, 5, torch.device("cpu"))
    seg.block.fill_(-1)
    tensors = _mixed_for_each(kit)[:4]
    tk.stats_many_into(tensors, seg.ints, seg.floats, [4, 0, 3, 1], block_size=256)
    for t, r in zip(tensors, [4, 0, 3, 1]):
        kit.assert_row_matches(t, seg.ints[r], seg.floats[r])
    assert (seg.block[2] == -1).all()


def test_flush_counts_over_many_steps_per_lane(tk, kit):
    """One program, 2000 steps of 16 lanes, every value flushed in every target: each lane's
    16-bit packed flush counts reach 2000, and the four fields sum without carrying into each other."""
    n = 16 * 2000
    x = torch.full((n,), 2.0**-140)  # an fp32 subnormal: at or below every flush limit
    x[::7] = 2.0**-20  # flushes in fp8 only (e4m3 at 2^-10, e5m2 at 2^-17), not in fp16 or bf16
    ints, floats = _one_row(tk, kit, x, block_size=16, max_programs=1)
    kit.assert_row_matches(x, ints, floats)
    from nan_hunter.kernels.stats import INT_FIELDS

    row = dict(zip(INT_FIELDS, ints.tolist()))
    few = n - len(range(0, n, 7))
    assert (row["under_fp16"], row["under_bf16"], row["under_e4m3"], row["under_e5m2"]) == (few, few, n, n)


def test_plan_keeps_per_lane_steps_under_2_to_15(tk):
    iters, _ = tk._plan([1 << 22], 16, 1)
    assert iters == 1 << 15


def test_kernel_constants_compare_by_value_without_building_constexprs():
    """Triton compares every global a kernel reads with ``!=`` before each launch; the module's
    constants answer with a plain bool (tl.constexpr's operator built new objects: host time per
    launch on the first GPU run)."""
    pytest.importorskip("triton")
    import triton.language as tl

    from nan_hunter.kernels.triton import _Constant

    a = _Constant(3)
    assert isinstance(a, tl.constexpr) and a.value == 3
    assert (a != _Constant(3)) is False and (a != tl.constexpr(3)) is False
    assert (a != _Constant(4)) is True and (a != 3) is True
    assert hash(a) == hash(tl.constexpr(3))
