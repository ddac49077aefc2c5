"""A GGUF file (llama.cpp), parsed as strictly as the safetensors header: header, metadata and tensor
infos validated the way ggml's ``gguf_init_from_file`` validates them, then data read through the
same bounded read-only windows as a safetensors file.

Layout (little-endian): ``"GGUF"``, version (u32: 2 or 3), tensor count and metadata count (u64);
metadata: key (u64 length + UTF-8), value type (u32), value (scalars, strings, or arrays of one
scalar/string type); tensor infos: name, dim count (u32, at most 4), dims (u64, fastest first), ggml
type (u32), offset (u64) into the data section, which starts at the next multiple of
``general.alignment`` (default 32) after the infos. ggml requires each tensor's offset to be the sum
of the padded sizes before it; so is it here.

What is refused, with one line (exit 2): a wrong magic or version, counts or lengths past the bounds
below or past what the file can hold, an unknown value or ggml type, an array of arrays, a key or
tensor name given twice, a name that is not UTF-8 or is 64 bytes or longer (ggml's limit), a first dim
that is not a whole number of blocks, a size that overflows, an offset out of order, misaligned or
past the end of the file. Nothing is kept of the metadata but the few scalars used (memory stays one
entry per tensor); nothing outside the file is read.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, overload

from ..errors import BadInput
from .regular_file import open_regular
from .safetensors_file import SafetensorsFile, TensorEntry

MAGIC = b"GGUF"
MAX_TENSORS = 500_000
MAX_KV = 1_000_000
MAX_STRING = 64 << 20  # one metadata string (chat templates are a few KB; token lists are arrays)
MAX_HEADER = 1 << 30  # header + metadata + tensor infos
MAX_NAME = 63  # GGML_MAX_NAME - 1
MAX_DIMS = 4
HINT = "re-convert or re-download the GGUF file"

#: ggml type id → (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
#: plain element types → the safetensors tag the weights scan reads them as
PLAIN_TAGS = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "F64": "F64",
    "I8": "I8",
    "I16": "I16",
    "I32": "I32",
    "I64": "I64",
}
QUANT_PREFIX = "GGUF_"  # tag of a block-quantized tensor: GGUF_Q4_K
# metadata value types: id → struct format of a scalar (strings and arrays apart)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass
class GgufHeader:
    version: int
    alignment: int
    data_start: int
    architecture: str | None
    file_type: int | None
    tensors: list[tuple[str, str, tuple[int, ...], int, int]]  # (name, tag, numpy shape, begin, end)


class _Bytes:
    """Sequential reads of the header region, each bounded by what is left of the file."""

    def __init__(self, f: BinaryIO, size: int, where: str) -> None:
        self.f, self.size, self.where = f, size, where
        self.pos = 0
        self.buf = b""
        self.off = 0

    def bad(self, msg: str) -> BadInput:
        return BadInput(f"{self.where}: {msg}; {HINT}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.bad(
                f"{what} at byte {self.pos} needs {n} bytes but the file ends at {self.size} (truncated?)"
            )
        if self.pos + n > MAX_HEADER:
            raise self.bad(f"the header passes {MAX_HEADER} bytes, nanhunter's limit")
        while len(self.buf) - self.off < n:
            chunk = self.f.read(max(1 << 20, n))
            if not chunk:
                raise self.bad("changed while being read")
            self.buf = self.buf[self.off :] + chunk
            self.off = 0
        out = self.buf[self.off : self.off + n]
        self.off += n
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> None:
        while n > 0:
            k = min(n, 1 << 24)
            self.take(k, what)
            n -= k

    def unpack(self, fmt: str, what: str) -> int:
        """An integer field (``fmt`` an integer struct format)."""
        return int(self.scalar(fmt, what))

    def scalar(self, fmt: str, what: str) -> int | float:
        """A scalar field of struct format ``fmt`` (a bool, an integer or a float)."""
        value: int | float = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    @overload
    def string(self, what: str, limit: int = MAX_STRING, keep: Literal[True] = True) -> str: ...

    @overload
    def string(self, what: str, limit: int = MAX_STRING, *, keep: bool) -> str | None: ...

    def string(self, what: str, limit: int = MAX_STRING, keep: bool = True) -> str | None:
        n = self.unpack("<Q", f"{what} length")
        if n > limit:
            raise self.bad(f"{what} is {n} bytes long, over the {limit}-byte limit")
        if not keep:
            self.skip(n, what)
            return None
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.bad(f"{what} is not UTF-8 (invalid byte at offset {e.start})") from None


def _value(r: _Bytes, vtype: int, key: str, keep: bool) -> int | float | str | None:
    if vtype in _SCALARS:
        return r.scalar(_SCALARS[vtype], f"value of {key!r}")
    if vtype == _STRING:
        return r.string(f"string value of {key!r}", keep=keep)
    if vtype == _ARRAY:
        itype = r.unpack("<I", f"array type of {key!r}")
        n = r.unpack("<Q", f"array length of {key!r}")
        if itype == _ARRAY:
            raise r.bad(f"metadata {key!r} is an array of arrays, which ggml does not read")
        if itype in _SCALARS:
            size = struct.calcsize(_SCALARS[itype])
            if n * size > r.size - r.pos:
                raise r.bad(
                    f"metadata {key!r}: {n} array items need {n * size} bytes, more than the file holds"
                )
            r.skip(n * size, f"array {key!r}")
            return None
        if itype != _STRING:
            raise r.bad(f"metadata {key!r}: unknown array item type {itype}")
        if n * 8 > r.size - r.pos:
            raise r.bad(f"metadata {key!r}: {n} strings cannot fit in what is left of the file")
        for _ in range(n):
            r.string(f"a string of array {key!r}", keep=False)
        return None
    raise r.bad(f"metadata {key!r} has unknown value type {vtype}")


def parse_gguf(f: BinaryIO, size: int, where: str) -> GgufHeader:
    """Validate the header, metadata and tensor infos of a GGUF file ``f`` of ``size`` bytes."""
    r = _Bytes(f, size, where)
    if size < 24 or r.take(4, "magic") != MAGIC:
        raise BadInput(f"{where}: not a GGUF file (no 'GGUF' magic); {HINT}")
    version = r.unpack("<I", "version")
    if version not in (2, 3):
        hint = " (it looks big-endian)" if version in (0x02000000, 0x03000000) else ""
        raise r.bad(f"GGUF version {version}{hint}: nanhunter reads little-endian versions 2 and 3")
    n_tensors, n_kv = r.unpack("<Q", "tensor count"), r.unpack("<Q", "metadata count")
    if n_tensors > MAX_TENSORS or n_tensors * 24 > size:
        raise r.bad(f"{n_tensors} tensors: more than {MAX_TENSORS:,} or than the file can describe")
    if n_kv > MAX_KV or n_kv * 13 > size:
        raise r.bad(f"{n_kv} metadata entries: more than {MAX_KV:,} or than the file can hold")
    keys: set[str] = set()
    alignment = 32
    arch: str | None = None
    file_type: int | None = None
    for _ in range(n_kv):
        key = r.string("metadata key", limit=65535)
        if key in keys:
            raise r.bad(f"metadata key {key!r} is given twice")
        keys.add(key)
        vtype = r.unpack("<I", f"type of {key!r}")
        small = key in ("general.alignment", "general.architecture", "general.file_type")
        v = _value(r, vtype, key, keep=small)
        if key == "general.alignment":
            if vtype != 4 or not isinstance(v, int) or not v or v & (v - 1):
                raise r.bad(f"general.alignment is {v!r}: ggml needs a power of two (u32)")
            alignment = v
        elif key == "general.architecture" and isinstance(v, str):
            arch = v[:200]
        elif key == "general.file_type" and isinstance(v, int):
            file_type = v
    del keys
    infos: list[tuple[str, str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = r.string(f"name of tensor {i}", limit=1 << 16)
        if len(name.encode()) > MAX_NAME:
            raise r.bad(
                f"tensor name {name[:80]!r} is {len(name.encode())} bytes; ggml allows at most {MAX_NAME}"
            )
        if name in names:
            raise r.bad(f"tensor {name!r} is given twice")
        names.add(name)
        n_dims = r.unpack("<I", f"dim count of {name!r}")
        if n_dims > MAX_DIMS:
            raise r.bad(f"tensor {name!r} has {n_dims} dims; ggml allows at most {MAX_DIMS}")
        ne = [r.unpack("<Q", f"dims of {name!r}") for _ in range(n_dims)]
        ttype = r.unpack("<I", f"type of {name!r}")
        offset = r.unpack("<Q", f"offset of {name!r}")
        if ttype not in GGML_TYPES:
            raise r.bad(f"tensor {name!r} has unknown ggml type {ttype}")
        tname, blck, tsize = GGML_TYPES[ttype]
        if any(d >= 2**63 for d in ne):
            raise r.bad(f"tensor {name!r}: a dim of {ne} does not fit int64")
        if ne and ne[0] % blck:
            raise r.bad(
                f"tensor {name!r}: first dim {ne[0]} is not a whole number of {tname} blocks of {blck}"
            )
        n = math.prod(ne)
        nbytes = n // blck * tsize
        if n >= 2**63 or nbytes >= 2**63:
            raise r.bad(f"tensor {name!r}: {ne} {tname} overflows 64 bits")
        infos.append((name, tname, tuple(reversed(ne)), offset, nbytes))
    del names
    data_start = -(-r.pos // alignment) * alignment
    data_len = size - data_start
    expected = 0
    tensors: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for name, tname, shape, offset, nbytes in infos:
        if offset != expected:
            raise r.bad(
                f"tensor {name!r} has offset {offset}, expected {expected} (each tensor follows the one "
                f"before, padded to {alignment})"
            )
        if offset + nbytes > data_len:
            raise r.bad(
                f"tensor {name!r} needs bytes {offset}..{offset + nbytes} of the data section but it has "
                f"{max(0, data_len)} (truncated file)"
            )
        tag = PLAIN_TAGS.get(tname, QUANT_PREFIX + tname)
        tensors.append((name, tag, shape, offset, offset + nbytes))
        expected = offset + -(-nbytes // alignment) * alignment
    return GgufHeader(version, alignment, data_start, arch, file_type, tensors)


def ggml_type(tag: str) -> tuple[str, int, int] | None:
    """(name, elements per block, bytes per block) of a block-quantized tensor's tag, else None."""
    if not tag.startswith(QUANT_PREFIX):
        return None
    name = tag[len(QUANT_PREFIX) :]
    return next((t for t in GGML_TYPES.values() if t[0] == name), None)


class GgufFile(SafetensorsFile):
    """A GGUF file read like a safetensors file: entries with numpy-order shapes, the data section's
    bytes in bounded read-only windows (``read_tensor`` for the float tensors only)."""

    def __init__(self, path: Path, real: Path | None = None):  # noqa: D107 - no super().__init__: other header
        self.path = path
        self.real = real or path
        self.what = "checkpoint"
        with open_regular(self.real, "checkpoint") as f:
            st = os.fstat(f.fileno())
            header = parse_gguf(f, st.st_size, str(path))
        self._ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self.size = st.st_size
        self.data_start = header.data_start
        self.header = header
        self.metadata = {"gguf_version": str(header.version), "alignment": str(header.alignment)}
        self.entries = {
            name: TensorEntry(name, path, tag, shape, begin, end)
            for name, tag, shape, begin, end in header.tensors
        }
