"""The statistics of one trace entry, computed with the same torch ops on every device.

Per floating tensor (``digest``), over its finite values: ``absmax``, ``absmin`` (the smallest
non-zero |x|), ``total`` and ``sumsq`` (for ``mean`` and ``l2``), the NaN/+inf/−inf counts, and
``hash``. An entry with several output tensors combines them (``combine``): counts and sums add,
absmax/absmin take the max/min, and the hash chains every tensor in order.

- Finiteness, absmax and absmin come from the capture's own pass over the bit patterns
  (``kernels.reference.bit_magnitudes``: one ``aminmax`` of ``bits & mask``); a tensor holding a
  NaN or ±inf takes the masked path.
- ``total`` and ``sumsq`` are ``torch.sum`` and ``torch.linalg.vector_norm`` accumulated in fp32
  (a float64 reduction costs 3-8x more on CPU) and read as Python floats. Devices reduce in
  different orders, so CPU and CUDA agree to ~1e-6 relative: far inside any diff tolerance
  (1e-3). Values above 1e18 are scaled by absmax before squaring, so fp32 never overflows.
- ``hash``: CRC-32 (zlib) of ``b"<dtype>|<shape>|"`` followed by the tensor's bytes in row-major
  order (a CUDA tensor is copied to the host first), as 8 hex digits; several tensors chain the
  CRC. The same values in the same dtype and shape give the same hash on any device, in any
  process, whatever the memory layout; -0.0 and 0.0, or two NaN payloads, differ. An entry of
  several tensors hashes the 4-byte little-endian CRCs of its tensors, in order, the same way.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from ..dtypes import name_of
from ..kernels.reference import Unreadable, bit_magnitudes, plain

#: above this |x|, squares are scaled first: (1e18)^2 is well inside fp32's 3.4e38
_SCALE_ABOVE = 1e18


@dataclass(frozen=True)
class Digest:
    """What a trace keeps of one tensor (or of an entry's tensors, combined)."""

    shape: tuple[int, ...]
    dtype: str
    numel: int
    nan: int
    posinf: int
    neginf: int
    absmax: float | None  # over finite values; None when none is finite
    absmin: float | None  # smallest non-zero |x| over finite values; None when there is none
    total: float  # sum of the finite values
    sumsq: float  # sum of their squares
    finite_n: int  # how many values are finite
    crc: int  # CRC-32 of the tensor's header and bytes (several tensors: of their CRCs)

    @property
    def mean(self) -> float | None:
        return self.total / self.finite_n if self.finite_n else None

    @property
    def l2(self) -> float:
        return math.sqrt(self.sumsq)

    @property
    def hash(self) -> str:
        return f"{self.crc:08x}"


def dtype_name(dtype: torch.dtype) -> str:
    """``fp32``, ``bf16``, ``fp8-e4m3``... (the project's names), else torch's own (``int64``)."""
    return name_of(dtype) or str(dtype).removeprefix("torch.")


def tensor_crc(t: torch.Tensor, crc: int = 0) -> int:
    """CRC-32 of ``t``'s dtype, shape and row-major bytes, continuing ``crc`` (any dtype)."""
    head = f"{dtype_name(t.dtype)}|{','.join(map(str, t.shape))}|".encode()
    crc = zlib.crc32(head, crc)
    if t.numel() == 0:
        return crc
    x = t.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    x = x.contiguous().reshape(-1)
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    return zlib.crc32(x.view(torch.uint8).numpy(), crc)  # type: ignore[arg-type]  # numpy: __buffer__ from Python 3.12


def _wide(x: torch.Tensor) -> torch.Tensor:
    """fp8 widened to fp32 (its arithmetic is not implemented); other floats as they are."""
    return x.float() if x.element_size() == 1 else x


def _sums(f: torch.Tensor, absmax: float) -> tuple[float, float]:
    """(sum, sum of squares) of a finite float tensor, reduced in at least fp32."""
    acc = torch.float32 if f.dtype in (torch.float16, torch.bfloat16, torch.float32) else f.dtype
    total = float(torch.sum(f, dtype=acc))
    if absmax > _SCALE_ABOVE:
        norm = float(torch.linalg.vector_norm(f.to(acc) / absmax)) * absmax
    else:
        norm = float(torch.linalg.vector_norm(f, dtype=acc))
    return total, norm * norm


def digest(t: torch.Tensor, hash: bool = True) -> Digest:
    """The statistics of floating tensor ``t`` (a subclass through its plain values); with
    ``hash=False`` no bytes are read for the hash (``crc`` 0: in-memory recordings keep the
    tensors themselves, and a CUDA tensor would be copied to the host for it)."""
    x = plain(t)
    shape, dtype, n = tuple(x.shape), dtype_name(x.dtype), x.numel()
    crc = tensor_crc(x) if hash else 0
    if n == 0:
        return Digest(shape, dtype, 0, 0, 0, 0, None, None, 0.0, 0.0, 0, crc)
    w = _wide(x)
    found = bit_magnitudes(w) if w.element_size() in (2, 4, 8) else None
    if found is not None:  # every value finite: the fast path
        absmax, absmin, _ = found
        total, sumsq = _sums(w.reshape(-1), absmax)
        return Digest(
            shape, dtype, n, 0, 0, 0, absmax, absmin if math.isfinite(absmin) else None, total, sumsq, n, crc
        )
    f = w.reshape(-1)
    isnan = torch.isnan(f)
    isinf = torch.isinf(f)
    pos = int((isinf & (f > 0)).sum())
    nan, neg = int(isnan.sum()), int(isinf.sum()) - pos
    ff = f[~(isnan | isinf)]
    if ff.numel() == 0:
        return Digest(shape, dtype, n, nan, pos, neg, None, None, 0.0, 0.0, 0, crc)
    a = ff.abs()
    absmax = float(a.max())
    nz = a[a > 0]
    total, sumsq = _sums(ff, absmax)
    return Digest(
        shape,
        dtype,
        n,
        nan,
        pos,
        neg,
        absmax,
        float(nz.min()) if nz.numel() else None,
        total,
        sumsq,
        ff.numel(),
        crc,
    )


def combine(parts: list[Digest]) -> Digest | None:
    """One digest for an entry's tensors (shape and dtype of the first; the CRC of their CRCs)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    maxes = [p.absmax for p in parts if p.absmax is not None]
    mins = [p.absmin for p in parts if p.absmin is not None]
    crc = 0
    for p in parts:
        crc = zlib.crc32(p.crc.to_bytes(4, "little"), crc)
    return Digest(
        first.shape,
        first.dtype,
        sum(p.numel for p in parts),
        sum(p.nan for p in parts),
        sum(p.posinf for p in parts),
        sum(p.neginf for p in parts),
        max(maxes) if maxes else None,
        min(mins) if mins else None,
        sum(p.total for p in parts),
        sum(p.sumsq for p in parts),
        sum(p.finite_n for p in parts),
        crc,
    )


def readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read (a subclass without plain data cannot)."""
    try:
        plain(t)
    except Unreadable:
        return False
    return True
