"""One safetensors file: its validated header, and its data read through bounded read-only windows.

The file is opened ``O_RDONLY`` and mapped ``MAP_SHARED`` with ``PROT_READ`` one window at a time
(``WINDOW`` bytes): nothing can be written back (the open mode forbids it, a private
copy-on-write map is never made), the mapping is never charged against memory, and the pages a
scan has touched leave the process when the window moves on, so a file larger than RAM scans
with flat memory. Holes of a sparse file (``SEEK_DATA``) read as zeros without being mapped.

Views into a window are numpy arrays, read-only (the weights scan reads them with numpy alone, so a
weights-only scan never imports torch). Anything that may write to a tensor, such as building a
model, gets an owned torch copy (``read_tensor``), one tensor at a time; the quantized checks get
owned numpy copies of the few tensors and byte ranges they need (``read_array``, ``read_bytes``).
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ..errors import BadInput
from .bit_dtypes import BIT_TAGS
from .regular_file import open_regular, read_exact
from .safetensors_header import DTYPE_BITS, MAX_HEADER, NUMPY_DTYPES, TORCH_DTYPES, parse_header

if TYPE_CHECKING:  # pragma: no cover
    import torch

HINT_REGEN = "re-export or re-download the checkpoint"
HINT_RESAVE = "re-save it with safetensors.torch.save_file"
WINDOW = 64 << 20  # bytes mapped at a time: measured as fast as a whole-file map for the scan (~7 GB/s here)
PIECE = WINDOW // 2  # bytes of one tensor handed to the scan at a time (a window holds two)
_SEEK_DATA = getattr(os, "SEEK_DATA", None)


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """Where one tensor lives: file, dtype tag, shape and byte range within the data section."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype of this tag, None for tags torch cannot hold element-wise (F4, F6)."""
        import torch

        name = TORCH_DTYPES.get(self.dtype)
        return getattr(torch, name, None) if name else None


class SafetensorsFile:
    """One parsed safetensors file. ``path`` is what the user sees, ``real`` what is opened."""

    def __init__(self, path: Path, real: Path | None = None, what: str = "checkpoint"):
        self.path = path
        self.real = real or path
        self.what = what
        where = str(path) if what == "checkpoint" else f"{what} {path}"
        hint = HINT_REGEN if what == "checkpoint" else HINT_RESAVE
        with open_regular(self.real, what) as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            if size < 8:
                raise BadInput(
                    f"{where}: file is {size} bytes, too short to be safetensors (truncated?); {hint}"
                )
            (n,) = struct.unpack("<Q", read_exact(f, 8))
            if n > MAX_HEADER:
                raise BadInput(
                    f"{where}: header length {n} is over the safetensors limit of {MAX_HEADER} bytes "
                    f"(not a safetensors file, or corrupt); {hint}"
                )
            if 8 + n > size:
                raise BadInput(
                    f"{where}: header length {n} does not fit a {size}-byte file "
                    f"(truncated or not a safetensors file); {hint}"
                )
            raw = read_exact(f, n)
        if len(raw) != n:
            raise BadInput(f"{where}: changed while being read; run again when it is complete")
        self._ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self.size = size
        self.data_start = 8 + n
        header = parse_header(raw, size - 8 - n, where, hint)
        del raw
        self.metadata = header.metadata or {}
        self.entries: dict[str, TensorEntry] = {
            name: TensorEntry(name, path, tag, shape, begin, end)
            for name, tag, shape, begin, end in header.entries
        }

    def _open(self) -> BinaryIO:
        """The file, re-opened read-only; exit 2 if it is no longer the file whose header was read."""
        f = open_regular(self.real, self.what)
        st = os.fstat(f.fileno())
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self._ident:
            f.close()
            raise BadInput(
                f"{self.path}: changed since nanhunter read its header; run again when it is complete"
            )
        return f

    def read_tensor(self, e: TensorEntry) -> torch.Tensor:
        """An owned, writable copy of tensor ``e`` (reads its bytes only)."""
        import torch

        dtype = e.torch_dtype()
        if dtype is None:
            raise BadInput(
                f"{self.path}: tensor {e.name!r} has dtype {e.dtype}, which torch cannot load element-wise"
            )
        if e.nbytes == 0:
            return torch.empty(e.shape, dtype=dtype)
        buf = bytearray(e.nbytes)
        view = memoryview(buf)
        with self._open() as f:
            pos = 0
            while pos < e.nbytes:
                got = os.preadv(f.fileno(), [view[pos : pos + (1 << 30)]], self.data_start + e.begin + pos)
                if got <= 0:
                    raise BadInput(f"{self.path}: changed while being read; run again when it is complete")
                pos += got
        del view
        return torch.frombuffer(buf, dtype=dtype).view(e.shape)

    def read_bytes(self, e: TensorEntry, offset: int, nbytes: int) -> np.ndarray:
        """An owned uint8 copy of bytes ``offset .. offset + nbytes`` of tensor ``e`` (clipped to it):
        one bounded ``pread``, for the stripes a quantized check reads out of order."""
        offset = max(0, min(offset, e.nbytes))
        nbytes = max(0, min(nbytes, e.nbytes - offset))
        buf = bytearray(nbytes)
        view = memoryview(buf)
        with self._open() as f:
            pos = 0
            while pos < nbytes:
                got = os.preadv(
                    f.fileno(), [view[pos : pos + (1 << 30)]], self.data_start + e.begin + offset + pos
                )
                if got <= 0:
                    raise BadInput(f"{self.path}: changed while being read; run again when it is complete")
                pos += got
        del view
        return np.frombuffer(buf, dtype=np.uint8)

    def read_array(self, e: TensorEntry) -> np.ndarray:
        """An owned numpy copy of tensor ``e`` in its ``NUMPY_DTYPES`` dtype, shaped as stored (tags
        numpy has no dtype for come as their raw bits; packed sub-byte tags as a flat run of bytes)."""
        raw = self.read_bytes(e, 0, e.nbytes)
        dtype = NUMPY_DTYPES.get(e.dtype)
        if dtype is None:
            raise BadInput(
                f"{self.path}: tensor {e.name!r} has dtype {e.dtype}, which torch cannot load element-wise"
            )
        a = raw.view(dtype)
        packed = DTYPE_BITS.get(e.dtype, 8) < 8
        return a if packed else a.reshape(e.shape)

    def pieces(
        self, order: list[TensorEntry]
    ) -> Iterator[tuple[TensorEntry, Iterator[tuple[int, int, object]]]]:
        """For each entry in ``order`` (offset order is fastest): the entry and its pieces.

        A piece is ``(first element, element count, 1-D read-only numpy view or None)`` in the tag's
        ``NUMPY_DTYPES`` dtype (BF16 as its uint16 bits): None means the
        whole piece lies in a hole of a sparse file and reads as zeros. Consume each entry's
        pieces before asking for the next entry, and drop the views: that keeps one window
        (``WINDOW`` bytes) mapped at a time.
        """
        with self._open() as f:
            win = _Windows(f.fileno(), self.size)
            try:
                for e in order:
                    if e.dtype in BIT_TAGS:  # checked from their bits: raw bytes, whole packed groups
                        yield e, win.byte_pieces(self.data_start + e.begin, e.nbytes, BIT_TAGS[e.dtype][1])
                    else:
                        yield e, win.pieces(self.data_start + e.begin, e)
            finally:
                win.release()

    def byte_stripes(self, e: TensorEntry, stripe_bytes: int) -> Iterator[tuple[int, object]]:
        """Tensor ``e``'s bytes as ``(first byte, numpy uint8 view or None)`` pieces of whole stripes
        (``stripe_bytes`` each; at least one stripe per piece, about ``PIECE`` bytes when they
        fit); None is a hole (zeros). One window mapped at a time; drop each view before the next."""
        with self._open() as f:
            win = _Windows(f.fileno(), self.size)
            try:
                for first, _count, piece in win.byte_pieces(
                    self.data_start + e.begin, e.nbytes, stripe_bytes
                ):
                    yield first, piece
                    del piece
            finally:
                win.release()


class _Windows:
    """One bounded read-only map of an open file at a time."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.mm: mmap.mmap | None = None
        self.lo = self.hi = 0

    def release(self) -> None:
        self.mm = None  # views still alive keep their map; it is unmapped when the last one dies

    def _hole(self, off: int, nbytes: int) -> bool:
        """Whether [off, off + nbytes) lies entirely in a hole of a sparse file (reads as zeros)."""
        if _SEEK_DATA is None:
            return False
        try:
            return os.lseek(self.fd, off, _SEEK_DATA) >= off + nbytes
        except OSError as e:  # ENXIO: only holes from ``off`` on; anything else: read it as data
            return e.errno == errno.ENXIO

    def _map(self, off: int, nbytes: int) -> tuple[mmap.mmap, int]:
        if not (self.mm is not None and self.lo <= off and off + nbytes <= self.hi):
            self.mm = None
            lo = off - off % mmap.ALLOCATIONGRANULARITY
            hi = min(self.size, max(lo + WINDOW, off + nbytes))
            self.mm = mmap.mmap(self.fd, hi - lo, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=lo)
            self.lo, self.hi = lo, hi
        return self.mm, off - self.lo

    def pieces(self, start: int, e: TensorEntry) -> Iterator[tuple[int, int, object]]:
        dtype = np.dtype(NUMPY_DTYPES[e.dtype])
        size = DTYPE_BITS[e.dtype] // 8
        n = e.numel
        step = max(1, PIECE // size)
        for first in range(0, n, step):
            count = min(step, n - first)
            off, nbytes = start + first * size, count * size
            if self._hole(off, nbytes):
                yield first, count, None
                continue
            mm, rel = self._map(off, nbytes)
            if off % size == 0:
                yield first, count, np.frombuffer(mm, dtype, count, rel)
            else:  # unaligned data (a header length not padded to 8): copy this piece only
                yield first, count, np.frombuffer(mm[rel : rel + nbytes], dtype, count)
            del mm

    def byte_pieces(self, start: int, nbytes: int, align: int = 1) -> Iterator[tuple[int, int, object]]:
        """``(first byte, byte count, 1-D read-only numpy uint8 view or None)`` over ``nbytes`` bytes
        from ``start``; every piece but the last holds a multiple of ``align`` bytes."""
        step = max(align, PIECE - PIECE % align)
        for first in range(0, nbytes, step):
            count = min(step, nbytes - first)
            off = start + first
            if self._hole(off, count):
                yield first, count, None
                continue
            mm, rel = self._map(off, count)
            yield first, count, np.frombuffer(mm, np.uint8, count, rel)
            del mm
