"""Fused statistics kernel (Triton): reads a tensor once, writes one stats row, never syncs the host.

Numerics: every element is turned into the exact fp32 bit pattern of its value with integer ops
(fp16, bf16 and fp8 are decoded from their stored bits), and every field is computed from those
bits, so results are exact on GPU (no flush-to-zero for subnormals) and under TRITON_INTERPRET=1,
whose fp8 loads are wrong. Only sum/sumsq use float arithmetic (fp32, order differs from torch).
Each program reduces a chunk in registers, then merges into the row with relaxed atomics: add
for counts and sums, int max/min on the float bits for absmax and min_nonzero (non-negative
floats order like their bits), and an unsigned min for first_nonfinite. Rows are initialised by
a small launch first; first_nonfinite starts at -1, the largest uint64 for that unsigned min, so
the row is final when the reduction ends: no finalize launch.

Launch strategy, a pointer table: ``stats_many_into`` packs (address, numel, columns, row stride,
row, format, ...) of every tensor into one int64 table (one pinned, async copy to the device),
initialises all rows in one launch, then covers all blocks of all tensors, mixed dtypes included,
in one reduce launch: each program binary-searches the table for its tensor, casts the address
to a pointer of the storage width and branches on the format code (uniform per program, so no
divergence). The only split is by 16-byte alignment of the base address, a compile-time hint
that lets full blocks load 16 bytes at a time, so a typical call is 2 launches, 3 when some base
is misaligned. ``stats_each_into`` passes every tensor as scalars (no table, no host memory):
one launch initialises a contiguous range of rows, then one reduce launch per tensor. It is the
launcher for CUDA-graph capture, where launch cost is paid once at capture and the replay only
re-runs the recorded kernels; ``stats_into`` is its one-tensor case (2 launches).

Layouts: contiguous tensors and views that are a strided stack of contiguous rows (what
``t.view(-1, t.size(-1))`` accepts, broadcast rows included) or one strided line are read in
place; anything else (transposes, permutes) is first copied with ``.contiguous()``.
"""

from __future__ import annotations

import contextlib
import struct

import torch
import triton
import triton.language as tl

from ..dtypes import limits
from .stats import FLOAT_FIELDS, INT_FIELDS, N_FLOAT, N_INT

# 1024 elements per loop step: 8 per thread at 4 warps (two 16-byte loads for fp32). ptxas for
# sm_90 reports 153-158 registers, no spills: the 8 per-lane accumulators dominate.
BLOCK_SIZE = 1024
MAX_PROGRAMS = 4096  # beyond this many blocks, programs loop over several (fewer atomics)
NUM_WARPS = 4

# Format codes: the kernel's branch on how to decode stored bits into fp32 bits.
_FORMATS = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
}


SUPPORTED_DTYPES = tuple(_FORMATS)


def _f32_bits(x: float) -> int:
    """The fp32 bit pattern of ``x`` as a non-negative int (``x`` >= 0)."""
    bits: int = struct.unpack("<i", struct.pack("<f", x))[0]
    return bits


class _Constant(tl.constexpr):
    """A ``tl.constexpr`` whose ``!=`` is a plain comparison of values. Before every launch Triton
    checks, with ``!=``, that each global a kernel reads is unchanged since compilation, and
    ``tl.constexpr``'s own operator builds new constexpr objects to answer: with the ~40 globals
    below that was a large share of the host time per launch (368 µs per hook on an H100, with
    Triton 3.6, BENCHMARKS.md "GPU")."""

    def __ne__(self, other: object) -> bool:
        return not (isinstance(other, tl.constexpr) and other.value == self.value)

    __hash__ = tl.constexpr.__hash__


# Finite |x| above these overflows the named format; compared as fp32 bits (exact: all four
# limits are fp32 values).
_LIM_FP16 = _Constant(_f32_bits(torch.finfo(torch.float16).max))
_LIM_BF16 = _Constant(_f32_bits(torch.finfo(torch.bfloat16).max))
_LIM_E4M3 = _Constant(_f32_bits(torch.finfo(torch.float8_e4m3fn).max))
_LIM_E5M2 = _Constant(_f32_bits(torch.finfo(torch.float8_e5m2).max))
# Non-zero |x| at or below these rounds to zero when cast to the named format (half its smallest
# subnormal, an fp32 value: 2^-25, 2^-134, 2^-10, 2^-17).
_FLUSH_FP16 = _Constant(_f32_bits(limits("fp16").flush))
_FLUSH_BF16 = _Constant(_f32_bits(limits("bf16").flush))
_FLUSH_E4M3 = _Constant(_f32_bits(limits("fp8-e4m3").flush))
_FLUSH_E5M2 = _Constant(_f32_bits(limits("fp8-e5m2").flush))
_INF_BITS = _Constant(0x7F800000)
_NAN_BITS = _Constant(0x7FC00000)
_ABS_MASK = _Constant(0x7FFFFFFF)
_INT32_MAX = _Constant(2**31 - 1)
_MASK21 = _Constant(2**21 - 1)
_TWO_M24 = _Constant(2.0**-24)  # fp16 subnormal step
_TWO_M9 = _Constant(2.0**-9)  # e4m3 subnormal step
_INF = _Constant(float("inf"))

# Row layout.
_N_INT = _Constant(N_INT)
_N_FLOAT = _Constant(N_FLOAT)
_I_NUMEL = _Constant(INT_FIELDS.index("numel"))
_I_NAN = _Constant(INT_FIELDS.index("nan"))
_I_POSINF = _Constant(INT_FIELDS.index("posinf"))
_I_NEGINF = _Constant(INT_FIELDS.index("neginf"))
_I_ZERO = _Constant(INT_FIELDS.index("zero"))
_I_SUB = _Constant(INT_FIELDS.index("subnormal"))
_I_O16 = _Constant(INT_FIELDS.index("over_fp16"))
_I_OBF = _Constant(INT_FIELDS.index("over_bf16"))
_I_OE4 = _Constant(INT_FIELDS.index("over_e4m3"))
_I_OE5 = _Constant(INT_FIELDS.index("over_e5m2"))
_I_U16 = _Constant(INT_FIELDS.index("under_fp16"))
_I_UBF = _Constant(INT_FIELDS.index("under_bf16"))
_I_UE4 = _Constant(INT_FIELDS.index("under_e4m3"))
_I_UE5 = _Constant(INT_FIELDS.index("under_e5m2"))
_I_FIRST = _Constant(INT_FIELDS.index("first_nonfinite"))
_F_ABSMAX = _Constant(FLOAT_FIELDS.index("absmax"))
_F_MINNZ = _Constant(FLOAT_FIELDS.index("min_nonzero"))
_F_SUM = _Constant(FLOAT_FIELDS.index("sum"))
_F_SUMSQ = _Constant(FLOAT_FIELDS.index("sumsq"))

# Pointer-table columns (int64).
_C_ADDR, _C_NUMEL, _C_NCOLS, _C_STRIDE, _C_ROW, _C_FMT, _C_TINY, _C_PSTART = range(8)
_W = _Constant(8)
_TC_ADDR = _Constant(_C_ADDR)
_TC_NUMEL = _Constant(_C_NUMEL)
_TC_NCOLS = _Constant(_C_NCOLS)
_TC_STRIDE = _Constant(_C_STRIDE)
_TC_ROW = _Constant(_C_ROW)
_TC_FMT = _Constant(_C_FMT)
_TC_TINY = _Constant(_C_TINY)
_TC_PSTART = _Constant(_C_PSTART)


@triton.jit
def _load_f32_bits(addr, idx, mask, other, fmt, ALIGN: tl.constexpr):
    """fp32 bit patterns (int32) of the elements at element offsets ``idx`` from address ``addr``.

    ``mask``/``other`` are both None for a full block (no predication, so loads can vectorise).
    ``ALIGN`` (16 or 1) is what ``addr`` is a multiple of, stated on the pointer: an int-to-pointer
    cast carries no alignment, and without it no load is wider than one element.
    Narrow formats are decoded with integer ops; a subnormal's value m * 2^-k is computed in
    fp32, where it is exact and normal, so no denormal flushing can touch it.
    """
    if fmt == 0:
        p = tl.multiple_of(addr.to(tl.pointer_type(tl.int32)), ALIGN)
        u = tl.load(p + idx, mask=mask, other=other)
    elif fmt == 2:
        # bf16 is the top half of an fp32
        p = tl.multiple_of(addr.to(tl.pointer_type(tl.uint16)), ALIGN)
        u = tl.load(p + idx, mask=mask, other=other).to(tl.int32) << 16
    elif fmt == 3:
        # float8_e4m3fn: bias 7, no Inf, NaN at S.1111.111, max 448
        p = tl.multiple_of(addr.to(tl.pointer_type(tl.uint8)), ALIGN)
        b = tl.load(p + idx, mask=mask, other=other).to(tl.int32)
        e = (b >> 3) & 0xF
        m = b & 0x7
        sub = (m.to(tl.float32) * _TWO_M9).to(tl.int32, bitcast=True)
        mag = tl.where(e == 0, sub, ((e + 120) << 23) | (m << 20))
        u = tl.where((b & 0x7F) == 0x7F, _NAN_BITS, mag) | ((b & 0x80) << 24)
    else:
        # fp16 (bias 15, exponent 31 = Inf/NaN); float8_e5m2 is the top byte of an fp16
        if fmt == 1:
            p16 = tl.multiple_of(addr.to(tl.pointer_type(tl.uint16)), ALIGN)
            h = tl.load(p16 + idx, mask=mask, other=other).to(tl.int32)
        else:
            p8 = tl.multiple_of(addr.to(tl.pointer_type(tl.uint8)), ALIGN)
            h = tl.load(p8 + idx, mask=mask, other=other).to(tl.int32) << 8
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        sub = (m.to(tl.float32) * _TWO_M24).to(tl.int32, bitcast=True)
        special = tl.where(m == 0, _INF_BITS, _NAN_BITS)
        mag = tl.where(e == 0, sub, tl.where(e == 31, special, ((e + 112) << 23) | (m << 13)))
        u = mag | ((h & 0x8000) << 16)
    return u


@triton.jit
def _add_packed(irow, packed, I0: tl.constexpr, I1: tl.constexpr, I2: tl.constexpr):
    """Add the three 21-bit counts packed in ``packed`` to fields I0, I1, I2 of the row, each
    with a relaxed atomic that is skipped when the count is 0 (most are)."""
    c = packed & _MASK21
    tl.atomic_add(irow + I0, c, mask=c > 0, sem="relaxed")
    c = (packed >> 21) & _MASK21
    tl.atomic_add(irow + I1, c, mask=c > 0, sem="relaxed")
    c = packed >> 42
    tl.atomic_add(irow + I2, c, mask=c > 0, sem="relaxed")


@triton.jit
def _add_flushed(irow, flushed):
    """Add the four 16-bit per-lane flush counts packed in ``flushed`` to their fields, each
    summed over the lanes in int64 and skipped when 0."""
    c = tl.sum(flushed & 0xFFFF)
    tl.atomic_add(irow + _I_U16, c, mask=c > 0, sem="relaxed")
    c = tl.sum((flushed >> 16) & 0xFFFF)
    tl.atomic_add(irow + _I_UBF, c, mask=c > 0, sem="relaxed")
    c = tl.sum((flushed >> 32) & 0xFFFF)
    tl.atomic_add(irow + _I_UE4, c, mask=c > 0, sem="relaxed")
    c = tl.sum(flushed >> 48)
    tl.atomic_add(irow + _I_UE5, c, mask=c > 0, sem="relaxed")


@triton.jit(do_not_specialize=["row0", "ints_stride", "floats_stride"])
def _init_rows_kernel(
    table_ptr, ints_ptr, floats_ptr, row0, ints_stride, floats_stride, FROM_TABLE: tl.constexpr
):
    """Write a starting row per program: zero counts (numel too: the reduction's first program
    stores it), first_nonfinite -1, min_nonzero +inf. The row is the table entry's (FROM_TABLE)
    or ``row0 + program id`` (a contiguous range of rows, no table)."""
    pid = tl.program_id(0).to(tl.int64)
    if FROM_TABLE:
        row = tl.load(table_ptr + pid * _W + _TC_ROW)
    else:
        row = row0.to(tl.int64) + pid
    cols = tl.arange(0, 16)
    ivals = tl.where(cols == _I_FIRST, -1, 0).to(tl.int64)
    tl.store(ints_ptr + row * ints_stride + cols, ivals, mask=cols < _N_INT)
    fvals = tl.where(cols == _F_MINNZ, _INF, 0.0)
    tl.store(floats_ptr + row * floats_stride + cols, fvals, mask=cols < _N_FLOAT)


@triton.jit(
    do_not_specialize=[
        "n_entries",
        "ints_stride",
        "floats_stride",
        "iters",
        "numel",
        "n_cols",
        "stride",
        "row",
        "fmt",
        "tiny_bits",
    ]
)
def _stats_kernel(
    table_ptr, n_entries, ints_ptr, floats_ptr, ints_stride, floats_stride, iters,
    addr, numel, n_cols, stride, row, fmt, tiny_bits,
    BLOCK: tl.constexpr, SINGLE: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """Reduce ``iters`` blocks of one tensor and merge them into its row with atomics.

    SINGLE: the tensor comes as scalars (addr ... tiny_bits) and programs start at 0. Otherwise
    program ``pid`` belongs to the last table entry whose first program (PSTART) is <= pid.
    Elements are indexed flat, row-major: element i sits at ``(i // n_cols) * stride + i % n_cols``.
    The row was initialised by ``_init_rows_kernel``; program 0 of the tensor stores its numel.
    """
    pid = tl.program_id(0).to(tl.int64)
    if SINGLE:
        local = pid
    else:
        lo = pid * 0
        hi = lo + n_entries
        while hi - lo > 1:
            mid = (lo + hi) // 2
            take = tl.load(table_ptr + mid * _W + _TC_PSTART) <= pid
            lo = tl.where(take, mid, lo)
            hi = tl.where(take, hi, mid)
        entry = table_ptr + lo * _W
        addr = tl.load(entry + _TC_ADDR)
        numel = tl.load(entry + _TC_NUMEL)
        n_cols = tl.load(entry + _TC_NCOLS)
        stride = tl.load(entry + _TC_STRIDE)
        row = tl.load(entry + _TC_ROW)
        fmt = tl.load(entry + _TC_FMT)
        tiny_bits = tl.load(entry + _TC_TINY).to(tl.int32)
        local = pid - tl.load(entry + _TC_PSTART)

    irow = ints_ptr + row.to(tl.int64) * ints_stride
    frow = floats_ptr + row.to(tl.int64) * floats_stride
    if local == 0:
        tl.store(irow + _I_NUMEL, numel.to(tl.int64))

    lane = tl.arange(0, BLOCK)
    chunk_start = local * iters * BLOCK
    n_steps = tl.minimum((numel - chunk_start + BLOCK - 1) // BLOCK, iters).to(tl.int32)
    contiguous = stride == n_cols

    # Nine counts packed three to an int64, 21 bits each: a program sees at most 2^20 elements
    # (see _plan), so no field can carry into the next. Three reductions instead of nine.
    nan_pinf_ninf = tl.zeros([BLOCK], dtype=tl.int64)
    zero_sub_o16 = tl.zeros([BLOCK], dtype=tl.int64)
    obf_oe4_oe5 = tl.zeros([BLOCK], dtype=tl.int64)
    # The four flush counts, 16 bits each, in one int64 per lane: a lane sees at most 2^15 steps
    # (see _plan); they are unpacked per lane before the reduction, whose sums need 21 bits.
    flushed = tl.zeros([BLOCK], dtype=tl.int64)
    amax = tl.zeros([BLOCK], dtype=tl.int32)  # max |x| bits over finite values: non-negative
    amin = tl.full([BLOCK], _INF_BITS, dtype=tl.int32)  # floats order like their bits as ints
    s = tl.zeros([BLOCK], dtype=tl.float32)
    ss = tl.zeros([BLOCK], dtype=tl.float32)
    first = tl.full([BLOCK], _INT32_MAX, dtype=tl.int32)  # position in the chunk: < 2^20

    for step in range(0, n_steps):
        start = chunk_start + step * BLOCK
        offs = start + lane  # flat int64 index
        valid = offs < numel
        if contiguous:
            if start + BLOCK <= numel:  # full block: unmasked, so aligned loads can vectorise
                u = _load_f32_bits(addr, offs, None, None, fmt, ALIGN)
            else:
                u = _load_f32_bits(addr, offs, valid, 0, fmt, ALIGN)
        else:
            u = _load_f32_bits(addr, (offs // n_cols) * stride + offs % n_cols, valid, 0, fmt, ALIGN)
        # masked lanes read bits 0 (+0.0): only the zero count needs ``valid``
        a = u & _ABS_MASK
        finite = a < _INF_BITS
        inf = a == _INF_BITS
        nan_pinf_ninf += (
            (a > _INF_BITS).to(tl.int64)
            | ((inf & (u > 0)).to(tl.int64) << 21)
            | ((inf & (u < 0)).to(tl.int64) << 42)
        )
        zero_sub_o16 += (
            ((a == 0) & valid).to(tl.int64)
            | (((a > 0) & (a < tiny_bits)).to(tl.int64) << 21)
            | ((finite & (a > _LIM_FP16)).to(tl.int64) << 42)
        )
        obf_oe4_oe5 += (
            (finite & (a > _LIM_BF16)).to(tl.int64)
            | ((finite & (a > _LIM_E4M3)).to(tl.int64) << 21)
            | ((finite & (a > _LIM_E5M2)).to(tl.int64) << 42)
        )
        # flushed to zero by a cast: 0 < |x| <= limit (masked lanes read +0.0, never counted)
        nonzero = a > 0
        flushed += (
            (nonzero & (a <= _FLUSH_FP16)).to(tl.int64)
            | ((nonzero & (a <= _FLUSH_BF16)).to(tl.int64) << 16)
            | ((nonzero & (a <= _FLUSH_E4M3)).to(tl.int64) << 32)
            | ((nonzero & (a <= _FLUSH_E5M2)).to(tl.int64) << 48)
        )
        amax = tl.maximum(amax, tl.where(finite, a, 0))
        amin = tl.minimum(amin, tl.where(finite & (a > 0), a, _INF_BITS))
        x = tl.where(finite, u.to(tl.float32, bitcast=True), 0.0)
        s += x
        ss += x * x
        first = tl.minimum(first, tl.where(finite, _INT32_MAX, step * BLOCK + lane))

    # merge into the row; skip atomics that would change nothing (most counts are 0)
    _add_packed(irow, tl.sum(nan_pinf_ninf), _I_NAN, _I_POSINF, _I_NEGINF)
    _add_packed(irow, tl.sum(zero_sub_o16), _I_ZERO, _I_SUB, _I_O16)
    _add_packed(irow, tl.sum(obf_oe4_oe5), _I_OBF, _I_OE4, _I_OE5)
    _add_flushed(irow, flushed)
    # first_nonfinite starts at -1, the largest uint64: an unsigned min keeps the smallest index
    f = tl.min(first)
    first_ptr = (irow + _I_FIRST).to(tl.pointer_type(tl.uint64))
    f_index = (chunk_start + f).to(tl.uint64, bitcast=True)
    tl.atomic_min(first_ptr, f_index, mask=f < _INT32_MAX, sem="relaxed")
    m = tl.max(amax)
    tl.atomic_max((frow + _F_ABSMAX).to(tl.pointer_type(tl.int32)), m, mask=m > 0, sem="relaxed")
    m = tl.min(amin)
    tl.atomic_min((frow + _F_MINNZ).to(tl.pointer_type(tl.int32)), m, mask=m < _INF_BITS, sem="relaxed")
    v = tl.sum(s)
    tl.atomic_add(frow + _F_SUM, v, mask=v != 0.0, sem="relaxed")
    v = tl.sum(ss)
    tl.atomic_add(frow + _F_SUMSQ, v, mask=v != 0.0, sem="relaxed")


# ---------------------------------------------------------------------------------------- host


def _describe(t: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Table entry (addr, numel, n_cols, stride, fmt, tiny_bits) of ``t`` and the tensor read."""
    fmt = _FORMATS.get(t.dtype)
    if fmt is None:
        supported = ", ".join(str(d) for d in _FORMATS)
        raise TypeError(f"stats kernel: unsupported dtype {t.dtype} (supported: {supported})")
    tiny = _f32_bits(torch.finfo(t.dtype).smallest_normal)
    n = t.numel()
    src = t
    v = None
    if n and not t.is_contiguous():
        # a stack of equally spaced contiguous rows, or one strided line, is read in place
        with contextlib.suppress(RuntimeError):
            v = t.view(-1, t.size(-1)) if t.stride(-1) == 1 else t.view(-1, 1)
    if v is not None:
        n_cols, stride = v.size(1), v.stride(0)
    else:
        if n and not t.is_contiguous():
            # transposes and permutes have no single row stride: copy (one extra pass over t)
            src = t.contiguous()
        n_cols = stride = max(n, 1)
    return [src.data_ptr(), n, n_cols, stride, fmt, tiny], src


def _check_buffers(ints: torch.Tensor, floats: torch.Tensor, device: torch.device) -> int:
    """Rows of the two stats buffers: int64 [cap, >= N_INT] and float32 [cap, >= N_FLOAT], unit
    stride along a row, any row stride (so both can be column ranges of one row-major block)."""
    for buf, dtype, width in ((ints, torch.int64, N_INT), (floats, torch.float32, N_FLOAT)):
        if buf.dtype != dtype or buf.dim() != 2 or buf.size(1) < width or buf.stride(1) != 1:
            raise ValueError(
                f"stats buffers must be {dtype}[cap, {width}] with unit stride along a row, "
                f"got {buf.dtype}{list(buf.shape)} strides {list(buf.stride())}"
            )
    if ints.device != device or floats.device != device:
        raise ValueError(f"tensor on {device}, stats buffers on {ints.device}/{floats.device}")
    return min(ints.size(0), floats.size(0))


def _check_row(row: int, cap: int) -> int:
    row = int(row)
    if not 0 <= row < cap:
        raise IndexError(f"stats row {row} out of range for {cap} rows")
    return row


def _plan(numels: list[int], block: int, max_programs: int) -> tuple[int, list[int]]:
    """Blocks per program (``iters``) and the program count of each tensor."""
    if block & (block - 1) or not 16 <= block <= 2**16:
        raise ValueError(f"block_size must be a power of two in [16, 65536], got {block}")
    total = sum(triton.cdiv(n, block) for n in numels)
    # packed per-program counts have 21 bits: a program reads at most 2^20 elements; packed
    # per-lane counts have 16 bits: a lane sees at most 2^15 steps
    iters = min(max(1, triton.cdiv(total, max_programs)), max(1, 2**20 // block), 2**15)
    return iters, [triton.cdiv(n, block * iters) for n in numels]


def _on(device: torch.device) -> contextlib.AbstractContextManager[object]:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _reduce_one(
    t: torch.Tensor,
    ints: torch.Tensor,
    floats: torch.Tensor,
    row: int,
    block_size: int,
    max_programs: int,
    num_warps: int,
) -> torch.Tensor:
    """One reduce launch for ``t`` (its row already initialised); returns the tensor read."""
    (addr, n, n_cols, stride, fmt, tiny), src = _describe(t)
    if n:
        iters, (programs,) = _plan([n], block_size, max_programs)
        _stats_kernel[(programs,)](
            ints, 1, ints, floats, ints.stride(0), floats.stride(0), iters, addr, n, n_cols, stride, row, fmt, tiny,
            BLOCK=block_size, SINGLE=True, ALIGN=16 if addr % 16 == 0 else 1, num_warps=num_warps,
        )  # fmt: skip
    return src


def prime_large(ints: torch.Tensor, floats: torch.Tensor) -> None:
    """Compile and load the per-tensor reduce variants for tensors of 2^31 elements or more
    (Triton types an integer argument as 64-bit by its value) with empty launches, so that
    such a tensor met inside CUDA-graph capture needs no compile there."""
    si, sf = ints.stride(0), floats.stride(0)
    big = 2**31
    with _on(ints.device):
        for n_cols in (big, 4096):  # contiguous (one line), and a stack of rows
            for align in (16, 1):
                _stats_kernel[(0,)](
                    ints, 1, ints, floats, si, sf, 1, ints.data_ptr(), big, n_cols, n_cols, 0, 0, 0,
                    BLOCK=BLOCK_SIZE, SINGLE=True, ALIGN=align, num_warps=NUM_WARPS,
                )  # fmt: skip


def stats_into(
    t: torch.Tensor,
    ints: torch.Tensor,
    floats: torch.Tensor,
    row: int,
    *,
    block_size: int = BLOCK_SIZE,
    max_programs: int = MAX_PROGRAMS,
    num_warps: int = NUM_WARPS,
) -> None:
    """Write the stats row of ``t`` into ``ints[row]``/``floats[row]``: two launches, no host sync."""
    stats_each_into(
        [t], ints, floats, row, block_size=block_size, max_programs=max_programs, num_warps=num_warps
    )


def stats_each_into(
    tensors: list[torch.Tensor],
    ints: torch.Tensor,
    floats: torch.Tensor,
    row0: int,
    *,
    block_size: int = BLOCK_SIZE,
    max_programs: int = MAX_PROGRAMS,
    num_warps: int = NUM_WARPS,
) -> None:
    """Stats of ``tensors[i]`` into row ``row0 + i``: one launch initialises the rows, then one
    reduce launch per non-empty tensor, with everything passed as kernel arguments. No host
    memory is touched, so this is the launcher that works inside CUDA-graph capture (where the
    pointer table's host-to-device copy cannot be captured safely); replaying the graph re-runs
    the initialisation and the reductions, so each replay rewrites the rows."""
    if not tensors:
        return
    device = tensors[0].device
    cap = _check_buffers(ints, floats, device)
    row0 = _check_row(row0, cap)
    _check_row(row0 + len(tensors) - 1, cap)
    for t in tensors:
        if t.device != device:
            raise ValueError(f"stats_each_into: tensors on {device} and {t.device}")
        if t.dtype not in _FORMATS:
            _describe(t)  # raises the unsupported-dtype error before anything is launched
    with _on(device):
        _init_rows_kernel[(len(tensors),)](
            ints, ints, floats, row0, ints.stride(0), floats.stride(0), FROM_TABLE=False
        )
        for i, t in enumerate(tensors):
            src = _reduce_one(t, ints, floats, row0 + i, block_size, max_programs, num_warps)
            del src  # a .contiguous() copy may be freed now: the allocator orders reuse after the kernel


def stats_many_into(
    tensors: list[torch.Tensor],
    ints: torch.Tensor,
    floats: torch.Tensor,
    rows: list[int],
    *,
    block_size: int = BLOCK_SIZE,
    max_programs: int = MAX_PROGRAMS,
    num_warps: int = NUM_WARPS,
    init: bool = True,
) -> None:
    """Stats rows of all ``tensors`` (any mix of supported dtypes) into ``rows``: one init launch,
    one reduce launch per base-address alignment class (usually one), no host sync.
    ``init=False`` skips the init launch: for rows that already hold the starting values (zero
    counts and sums, first_nonfinite -1, min_nonzero +inf) and are written once, as in the
    capture sink's append-only segments (``sink.Segment``)."""
    if len(tensors) != len(rows):
        raise ValueError(f"{len(tensors)} tensors but {len(rows)} rows")
    if not tensors:
        return
    device = tensors[0].device
    cap = _check_buffers(ints, floats, device)
    rows = [_check_row(r, cap) for r in rows]
    if len(set(rows)) != len(rows):
        raise ValueError("stats_many_into: two tensors share a row")
    keep = []  # tensors read by the kernel (``.contiguous()`` copies among them) live to the launch
    aligned: list[list[int]] = []
    unaligned: list[list[int]] = []
    empty: list[list[int]] = []
    for t, row in zip(tensors, rows):
        if t.device != device:
            raise ValueError(f"stats_many_into: tensors on {device} and {t.device}")
        (addr, n, n_cols, stride, fmt, tiny), src = _describe(t)
        keep.append(src)
        entry = [addr, n, n_cols, stride, row, fmt, tiny, 0]
        (empty if n == 0 else aligned if addr % 16 == 0 else unaligned).append(entry)
    iters, _ = _plan([e[_C_NUMEL] for e in aligned + unaligned], block_size, max_programs)
    group_programs = []
    for group in (aligned, unaligned):
        pstart = 0
        for e in group:
            e[_C_PSTART] = pstart
            pstart += triton.cdiv(e[_C_NUMEL], block_size * iters)
        group_programs.append(pstart)
    if not init and not any(group_programs):
        return  # only empty tensors, whose initialised rows are already final
    cuda = device.type == "cuda"
    # made in pinned memory (one allocation, not two), copied with non_blocking: an async copy (a
    # pageable one would synchronise the stream)
    table = torch.tensor(aligned + unaligned + empty, dtype=torch.int64, pin_memory=cuda)
    if cuda:
        table = table.to(device, non_blocking=True)
    si, sf = ints.stride(0), floats.stride(0)
    with _on(device):
        if init:
            _init_rows_kernel[(len(table),)](table, ints, floats, 0, si, sf, FROM_TABLE=True)
        first = 0
        for is_aligned, group, programs in zip((True, False), (aligned, unaligned), group_programs):
            if programs:
                _stats_kernel[(programs,)](
                    table[first:first + len(group)], len(group), ints, floats, si, sf, iters,
                    0, 0, 0, 0, 0, 0, 0,
                    BLOCK=block_size, SINGLE=False, ALIGN=16 if is_aligned else 1, num_warps=num_warps,
                )  # fmt: skip
            first += len(group)
    del keep
