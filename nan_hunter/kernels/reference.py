"""Statistics in plain torch: the CPU path and the oracle the Triton kernel is tested against.

``full_row`` computes every field of a stats row with tensor ops only (no ``.item()``), so it
is also sync-free on CUDA. ``quick_row`` is the CPU fast path: one ``aminmax`` pass tells
finite-or-not (aminmax propagates NaN and runs at memory speed, ~30 GB/s here, where
``isfinite(x).all()`` runs at ~1.4 GB/s); the full row is computed only when needed.

Both read ``plain(t)``: the tensor detached (a statistic is never part of the user's graph, and
a Python number taken from a ``requires_grad`` tensor warns), and a tensor subclass (torchao's
``Float8Tensor``, whose dispatch implements few ops) through its dequantised values or, failing
that, its plain inner data (``__tensor_flatten__``).
"""

from __future__ import annotations

import functools
import math
import threading

import torch

from ..dtypes import HEADROOM_DTYPES, limits
from .stats import FLOAT_FIELDS, INT_FIELDS, N_FLOAT, N_INT, OVER_FIELDS, UNDER_FIELDS

_OVER_LIMITS = tuple(limits(d).max for d in HEADROOM_DTYPES)  # finite |x| above: overflows the target
_FLUSH_LIMITS = tuple(limits(d).flush for d in HEADROOM_DTYPES)  # non-zero |x| at or below: cast to 0
_COUNTED = tuple(
    limits(d).flush < 2.0**-24 for d in HEADROOM_DTYPES
)  # quick_row counts fp16 and bf16 flushes


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """A float view fit for arithmetic: fp8 is widened (its ops are not implemented)."""
    if t.dtype.itemsize == 1:  # every fp8 format
        return t.to(torch.float32)
    return t


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


#: a subclass's own way back to its values, tried in this order: torchao's quantized tensors
#: (``dequantize``), its float8 training tensors (``to_original_precision``: ``_data / _scale``, which
#: the data × scale guess below would get wrong by scale²)
_DEQUANTIZE = ("dequantize", "to_original_precision")


class Unreadable(ValueError):
    """A tensor subclass whose values cannot be read as a plain tensor."""


def plain(t: torch.Tensor) -> torch.Tensor:
    """A detached plain tensor with ``t``'s values: the tensor itself, a subclass's own way back
    (``_DEQUANTIZE``), or its plain inner floating tensors (data × scale when there are two that
    broadcast, else all of them flattened side by side: quantised data and scales hold every NaN/Inf
    the values can have). Raises ``Unreadable`` when there is nothing plain inside."""
    if type(t) in _PLAIN_TYPES:
        return t.detach()
    if getattr(type(t), "__torch_dispatch__", None) is torch.Tensor.__torch_dispatch__:
        # a subclass with its own storage (only __torch_function__ overridden): its data is plain
        with torch._C.DisableTorchFunctionSubclass():
            return t.detach().as_subclass(torch.Tensor)
    for name in _DEQUANTIZE:
        deq = getattr(t, name, None)
        if not callable(deq):
            continue
        try:
            with torch.no_grad():
                v = deq()
            if type(v) in _PLAIN_TYPES and v.shape == t.shape:
                plain: torch.Tensor = v.detach()
                return plain
        except Exception:  # noqa: BLE001 - fall back to the inner data
            pass
    inner = _inner_floats(t)
    if not inner:
        raise Unreadable(f"{type(t).__name__} has no plain floating data to measure")
    if len(inner) == 2:  # quantised data and its scale: their product is the value
        data, scale = sorted(inner, key=lambda x: x.numel(), reverse=True)
        try:
            v = data.float() * scale.float()
            if v.shape == data.shape:
                return v
        except RuntimeError:  # scales that do not broadcast (blocked layouts)
            pass
    # otherwise every inner value side by side: their NaN/Inf, and the largest magnitude held
    return torch.cat([x.float().reshape(-1) for x in inner])


def _inner_floats(t: torch.Tensor, depth: int = 0) -> list[torch.Tensor]:
    """Plain floating tensors inside a traceable wrapper subclass (``__tensor_flatten__``), any
    fp8 data included."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None or depth > 3:
        return []
    try:
        names, _ = flatten()
    except Exception:  # noqa: BLE001
        return []
    out: list[torch.Tensor] = []
    for n in names:
        x = getattr(t, n, None)
        if not isinstance(x, torch.Tensor):
            continue
        if type(x) not in _PLAIN_TYPES:
            out += _inner_floats(x, depth + 1)
        elif x.is_floating_point():
            out.append(x.detach())
    return out


def _field(row: torch.Tensor, names: tuple[str, ...], name: str) -> torch.Tensor:
    i = names.index(name)
    return row[i : i + 1]


def full_row(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every stats field of floating tensor ``t`` as (int64[N_INT], float32[N_FLOAT]) on t's device."""
    t = plain(t)
    dev = t.device
    n = t.numel()
    # slices filled in place, never ``ints[i] = n``: on CUDA that can be a blocking copy
    ints = torch.zeros(N_INT, dtype=torch.int64, device=dev)
    floats = torch.zeros(N_FLOAT, dtype=torch.float32, device=dev)
    _field(ints, INT_FIELDS, "numel").fill_(n)
    if n == 0:
        _field(ints, INT_FIELDS, "first_nonfinite").fill_(-1)
        _field(floats, FLOAT_FIELDS, "min_nonzero").fill_(math.inf)
        return ints, floats
    x = _as_float(t).reshape(-1)
    tiny = torch.finfo(t.dtype).smallest_normal
    wide = (
        x if x.element_size() >= 4 else x.float()
    )  # fp16/bf16 widened exactly: the flush limits are fp32 values
    isnan = torch.isnan(x)
    isinf = torch.isinf(x)
    pos = isinf & (x > 0)
    finite = ~(isnan | isinf)
    a_wide = torch.where(finite, wide.abs(), torch.zeros((), dtype=wide.dtype, device=dev))
    a = a_wide.float()
    nonfinite = ~finite
    idx = torch.argmax(nonfinite.to(torch.uint8))  # first True; 0 when none
    any_bad = nonfinite.any()
    vals = [
        isnan.sum(),
        pos.sum(),
        (isinf & ~pos).sum(),
        (x == 0).sum(),
        (finite & (a_wide > 0) & (a_wide < tiny)).sum(),
        *[(a > lim).sum() for lim in _OVER_LIMITS],
        *[((a_wide > 0) & (a_wide <= lim)).sum() for lim in _FLUSH_LIMITS],
        torch.where(any_bad, idx, torch.full_like(idx, -1)),
    ]
    ints[1:] = torch.stack([v.to(torch.int64) for v in vals])
    nz = torch.where(a > 0, a, torch.full_like(a, math.inf))
    xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=dev)).float()
    floats[:] = torch.stack([a.max(), nz.min(), xf.sum(), (xf * xf).sum()])
    return ints, floats


_F_MIN_NZ = FLOAT_FIELDS.index("min_nonzero")
_UNDER_AT = tuple(INT_FIELDS.index(name) for name in UNDER_FIELDS)
_F_NAN = [math.nan] * (N_FLOAT - 1)  # the float fields after absmax a quick row does not compute


def _quick_ints() -> tuple[tuple[float, ...], list[list[int]]]:
    """The ascending overflow limits, and per number of them an absmax exceeds the int fields of a
    finite quick row (numel 0, set per row): no NaN/±inf; an overflow count is 0 where absmax is
    within the limit (knowable from absmax alone) and unknown (-1) past it, like every other count."""
    order = sorted(zip(OVER_FIELDS, _OVER_LIMITS), key=lambda x: x[1])
    rows = []
    for exceeded in range(len(order) + 1):
        ints = [0, 0, 0, 0] + [-1] * (N_INT - 4)
        for name, _ in order[exceeded:]:
            ints[INT_FIELDS.index(name)] = 0
        rows.append(ints)
    return tuple(lim for _, lim in order), rows


_OVER_ASCENDING, _QUICK_INTS = _quick_ints()
_OVER_LOWEST = _OVER_ASCENDING[0]
_INF, _NEG_INF, _NAN = math.inf, -math.inf, math.nan
assert len(_F_NAN) == 3  # finite_row writes the float fields after absmax out


def quick_row(t: torch.Tensor, underflow: bool = False) -> tuple[list[int], list[float]] | None:
    """CPU fast path: if ``t`` is all-finite, its row with only numel/counts/absmax filled (and,
    with ``underflow``, min_nonzero and the ``under_*`` counts).

    Returns None when ``t`` holds a NaN or ±Inf (the caller then needs ``full_row``).
    """
    # plain(t) without its cost for a plain tensor: detached only when part of a graph (a reduction
    # of a requires_grad tensor would record one)
    if type(t) in _PLAIN_TYPES:
        if t.requires_grad:
            t = t.detach()
    else:
        t = plain(t)
    n = t.numel()
    if n == 0:
        return None
    x = _as_float(t)
    if underflow:
        found = bit_magnitudes(x)
        if found is None:
            return None
        absmax, min_nz, flushed = found
    else:
        lo, hi = torch.aminmax(x)
        return finite_row(n, lo.item(), hi.item())
    row = _finite_of(n, absmax)
    ints = row[0]
    row[1][_F_MIN_NZ] = min_nz
    for i, k in zip(_UNDER_AT, flushed):
        ints[i] = -1 if k is None else k
    return row


def finite_row(n: int, lo: float, hi: float) -> tuple[list[int], list[float]] | None:
    """The quick row (``quick_row`` without ``underflow``) of a tensor of ``n`` > 0 elements whose
    smallest and largest values are ``lo`` and ``hi`` (as ``torch.aminmax`` gives them: NaN when
    one is NaN); None when it holds a NaN or ±Inf. Callers that read ``aminmax`` their own way
    (``capture.sink``: into a reused buffer) build the same row here. Written out in one function:
    a watched forward runs it for every tensor its hooks see."""
    if not _NEG_INF < lo <= hi < _INF:  # a NaN fails every comparison
        return None
    absmax = abs(hi) if hi >= -lo else -lo  # max(|lo|, |hi|), never -0.0
    if absmax <= _OVER_LOWEST:  # within every target's range: the common case
        ints = _QUICK_INTS[0][:]
    else:
        exceeded = 0
        for lim in _OVER_ASCENDING:
            if absmax <= lim:
                break
            exceeded += 1
        ints = _QUICK_INTS[exceeded][:]
    ints[0] = n
    return ints, [absmax, _NAN, _NAN, _NAN]


def _finite_of(n: int, absmax: float) -> tuple[list[int], list[float]]:
    exceeded = 0
    for lim in _OVER_ASCENDING:
        if absmax <= lim:
            break
        exceeded += 1
    ints = _QUICK_INTS[exceeded][:]
    ints[0] = n
    return ints, [absmax, *_F_NAN]


#: per storage width: the signed int dtype of the same width, the mask of every bit but the sign
_BIT_VIEWS = {
    8: (torch.int64, 0x7FFF_FFFF_FFFF_FFFF),
    4: (torch.int32, 0x7FFF_FFFF),
    2: (torch.int16, 0x7FFF),
}


@functools.cache
def _inf_bits(dtype: torch.dtype) -> int:
    return int(torch.tensor(math.inf, dtype=dtype).view(_BIT_VIEWS[dtype.itemsize][0]))


def _flush_bits(dtype: torch.dtype) -> tuple[int, ...]:
    """Per ``HEADROOM_DTYPES`` target: the bits of the largest |x| of ``dtype`` that the cast to the
    target rounds to zero (0 when ``dtype`` holds no such non-zero value)."""
    return _FLUSH_BITS.get(dtype) or _FLUSH_BITS.setdefault(
        dtype, tuple(_largest_at_most(lim, dtype) for lim in _FLUSH_LIMITS)
    )


_FLUSH_BITS: dict[torch.dtype, tuple[int, ...]] = {}


def _largest_at_most(lim: float, dtype: torch.dtype) -> int:
    v = torch.tensor(lim, dtype=torch.float64).to(dtype)
    if float(v) > lim:
        v = torch.nextafter(v, torch.zeros_like(v))
    return int(v.view(_BIT_VIEWS[dtype.itemsize][0]))


SCRATCH = 1 << 20  # elements per chunk of the abs-min pass: a reused buffer, no page faults per call
_scratch = threading.local()


def _buffer(dtype: torch.dtype, n: int, device: torch.device) -> torch.Tensor:
    """This thread's reused scratch of ``dtype`` on ``device`` with at least ``n`` (<= SCRATCH)
    elements (a tensor on another device than the last one gets a scratch of its own: a CUDA
    tensor measured by a host sink was once read into a CPU buffer, failed, and read as empty)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.dtype != dtype or buf.device != device:
        buf = torch.empty(SCRATCH, dtype=dtype, device=device)
        _scratch.buf = buf
    return buf[:n]


def bit_magnitudes(x: torch.Tensor) -> tuple[float, float, list[int | None]] | None:
    """(absmax, smallest non-zero |x| (inf when every value is zero), per ``HEADROOM_DTYPES``
    target the values a cast rounds to zero, None where not counted) of a float tensor, or None
    when it holds a NaN or ±Inf.

    Integer ops on the bit patterns (non-negative floats order like their bits), ``SCRATCH``
    elements at a time in a reused buffer (a fresh tensor-sized one costs more in page faults than
    the passes themselves): ``bits & mask`` is |x|; one ``aminmax`` gives absmax, finiteness and,
    when no value is zero, the abs-min. Zeros (ReLU outputs, masked probabilities) need two
    in-place passes more: ``(|x| - 1) & mask`` sends 0 to the largest value and every other |x|
    one below itself. A flush count is one compare pass over a chunk that holds a value at or
    below the limit, for the 16-bit targets only (``_COUNTED``); fp8's limits (2^-10, 2^-17) fall
    inside nearly every chunk's range, where a pass each would double the cost: left unmeasured
    unless no value is that small (the kernel counts them)."""
    width = x.element_size()
    int_dtype, mask = _BIT_VIEWS[width]
    inf_bits = _inf_bits(x.dtype)
    lims = _flush_bits(x.dtype)
    b = x.view(int_dtype)
    contiguous = x.is_contiguous()
    if contiguous:
        b = b.reshape(-1)
        chunks = [b[s : s + SCRATCH] for s in range(0, b.numel(), SCRATCH)]
    else:
        chunks = [b]  # strided (1-D views too): one pass over the view, into a fresh buffer
    top, lo_all = 0, mask + 1
    flushed: list[int | None] = [0] * len(lims)
    for c in chunks:
        buf = _buffer(int_dtype, c.numel(), c.device) if contiguous else torch.empty_like(c)
        torch.bitwise_and(c, mask, out=buf)
        lo, hi = torch.aminmax(buf)
        lo_i, hi_i = int(lo), int(hi)
        if hi_i >= inf_bits:
            return None
        top = max(top, hi_i)
        shifted = lo_i == 0
        if shifted:  # zeros present: the min over the others
            buf.sub_(1).bitwise_and_(mask)
            lo_i = int(buf.amin()) + 1  # mask + 1 when every value is zero
        lo_all = min(lo_all, lo_i)
        for i, (lim, counted) in enumerate(zip(lims, _COUNTED)):
            so_far = flushed[i]
            if lo_i > lim or so_far is None:
                continue
            # 0 < |x| <= limit: bits <= lim, or in the shifted form (zeros at the top) bits < lim
            flushed[i] = (
                so_far + int(torch.count_nonzero(buf < lim + (0 if shifted else 1))) if counted else None
            )
    absmax = float(torch.tensor(top, dtype=int_dtype).view(x.dtype))
    min_nz = math.inf if lo_all > mask else float(torch.tensor(lo_all, dtype=int_dtype).view(x.dtype))
    return absmax, min_nz, flushed
