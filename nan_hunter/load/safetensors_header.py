"""The safetensors header, parsed as the reference parser parses it.

The reference is the ``safetensors`` Rust crate (behind ``safetensors.safe_open`` and
transformers): an 8-byte little-endian length ``n`` (at most 100,000,000), ``n`` bytes of UTF-8
JSON read by serde_json into ``{"__metadata__": {str: str} | null, NAME: {"dtype", "shape",
"data_offsets"}}``, then ``Metadata::validate``: sorted by offsets, the tensors must tile the data
section from byte 0 to the end of the file with no gap or overlap, each exactly
``prod(shape) * bits(dtype) / 8`` bytes, with no arithmetic overflow. What it refuses is refused
here with one line, including its JSON rules (no NaN/Infinity, integers only where integers go,
numbers out of the u64/f64 range, lone surrogate escapes, nesting past 127, a known field or
``__metadata__`` given twice, trailing characters, a byte-order mark).

Deliberate differences: a tensor name given twice is refused (the reference silently keeps the
last); more than ``MAX_TENSORS`` tensors is refused (memory stays bounded per entry: each is
reduced to a small tuple while the JSON is parsed).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import BadInput
from .bounded_json import MAX_DEPTH, nesting_depth

MAX_HEADER = 100_000_000  # the reference's MAX_HEADER_SIZE (decimal, not MiB)
MAX_TENSORS = 500_000  # per file; real checkpoints hold at most a few thousand per shard
_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)

#: Every dtype tag of the format → bits per element (sub-byte tags pack several per byte).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
#: dtype tag → torch dtype attribute; tags torch cannot hold element-wise (F4, F6) are absent.
TORCH_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}
#: dtype tag → the numpy dtype its bytes are read as (little-endian, as the format stores them). Tags
#: numpy has no dtype for are read as their raw bits: BF16 as uint16, the 1-byte floats as uint8
#: (``bit_dtypes`` decodes them); the packed sub-byte tags (F4, F6) are read as bytes.
NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "?",
    "U8": "u1",
    "I8": "i1",
    "F8_E5M2": "u1",
    "F8_E4M3": "u1",
    "F8_E8M0": "u1",
    "F8_E4M3FNUZ": "u1",
    "F8_E5M2FNUZ": "u1",
    "I16": "<i2",
    "U16": "<u2",
    "F16": "<f2",
    "BF16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "F32": "<f4",
    "C64": "<c8",
    "F64": "<f8",
    "I64": "<i8",
    "U64": "<u8",
    "F4": "u1",
    "F6_E2M3": "u1",
    "F6_E3M2": "u1",
}
_FIELDS = ("dtype", "shape", "data_offsets")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Header:
    """A validated header: entries ``(name, dtype, shape, begin, end)`` in offset order."""

    metadata: dict[str, str] | None
    entries: list[tuple[str, str, tuple[int, ...], int, int]]


class _Malformed(ValueError):
    """Raised inside the JSON hooks; becomes one BadInput line."""


class _Entry(tuple[Any, ...]):
    """A valid tensor entry, reduced while parsing: (dtype, shape, begin, end)."""


class _Obj(list[tuple[str, Any]]):
    """Any other JSON object, kept as its (key, value) pairs (duplicates stay visible)."""


def show(v: Any, limit: int = 60) -> str:
    """An untrusted JSON value for an error line: JSON-like, escaped (``repr``) and clipped."""
    if type(v) is _Obj:
        text = (
            "{"
            + ", ".join(f"{k!r}: {show(x, limit)}" for k, x in v[:4])
            + (", ..." if len(v) > 4 else "")
            + "}"
        )
    elif type(v) is list:
        text = "[" + ", ".join(show(x, limit) for x in v[:4]) + (", ..." if len(v) > 4 else "") + "]"
    else:
        text = repr(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise _Malformed(f"number {text[:24]}{'…' if len(text) > 24 else ''} is out of range")
    return v


def _int(text: str) -> int | float:
    """A JSON integer as serde_json reads it: u64 when it fits, i64 when negative and fits, else
    an f64 (out of range when infinite); ``-0`` is the float -0.0."""
    if len(text) <= 20 and text != "-0":
        v = int(text)
        if _I64_MIN <= v <= _U64_MAX:
            return v
    return _float(text)


def _constant(name: str) -> Any:
    raise _Malformed(f"{name} is not a JSON value")


def _usize(v: Any) -> bool:
    return type(v) is int and v >= 0


def _dtype_of(v: Any) -> str | None:
    """A dtype tag: a string, or serde's map form of a unit variant (``{"F32": null}``)."""
    if type(v) is str:
        return v if v in DTYPE_BITS else None
    if type(v) is _Obj and len(v) == 1 and v[0][0] in DTYPE_BITS and v[0][1] is None:
        return v[0][0]
    return None


def _entry(dtype: Any, shape: Any, offsets: Any) -> _Entry | None:
    tag = _dtype_of(dtype)
    if tag is None or type(shape) is not list or not all(_usize(d) for d in shape):
        return None
    if type(offsets) is not list or len(offsets) != 2 or not all(_usize(o) for o in offsets):
        return None
    return _Entry((tag, tuple(shape), offsets[0], offsets[1]))


def _why_not_entry(v: Any) -> str:
    """Why ``v`` is not a tensor entry, for the error line."""
    if type(v) is list:
        if len(v) != 3:
            return f"a list of {len(v)} items instead of an object with {', '.join(_FIELDS)}"
        fields = dict(zip(_FIELDS, v))
    elif type(v) is _Obj:
        fields = {}
        for k, x in v:
            if k in _FIELDS and k in fields:
                return f"field {k!r} is given twice"
            fields[k] = x
        missing = [f for f in _FIELDS if f not in fields]
        if missing:
            return f"missing field {missing[0]!r}"
    else:
        kind = {
            type(None): "null",
            bool: "a boolean",
            str: "a string",
            int: "a number",
            float: "a number",
        }.get(type(v), "not an object")
        return f"{kind} instead of an object with {', '.join(_FIELDS)}"
    if _dtype_of(fields["dtype"]) is None:
        return f"unknown dtype {show(fields['dtype'])} (the format knows {', '.join(DTYPE_BITS)})"
    shape, offsets = fields["shape"], fields["data_offsets"]
    if type(shape) is not list or not all(_usize(d) for d in shape):
        return f"shape {show(shape)} is not a list of non-negative integers"
    return f"data_offsets {show(offsets)} is not a pair of non-negative integers"


class _Parser:
    """JSON hooks that reduce entries as they are parsed and count them against the limit."""

    def __init__(self, check_surrogates: bool):
        self.entries = 0
        self.others = 0
        self.check_surrogates = check_surrogates

    def _strings_ok(self, v: Any) -> None:
        if type(v) is str:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise _Malformed("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff)") from None
        elif type(v) is list:
            for x in v:
                self._strings_ok(x)

    def hook(self, pairs: list[tuple[str, Any]]) -> _Entry | _Obj:
        if self.check_surrogates:
            for k, v in pairs:
                self._strings_ok(k)
                self._strings_ok(v)
        fields: dict[str, Any] = {}
        for k, v in pairs:
            if k in _FIELDS:
                if k in fields:
                    break  # a known field given twice: not an entry (serde refuses it)
                fields[k] = v
        else:
            if len(fields) == 3:
                e = _entry(fields["dtype"], fields["shape"], fields["data_offsets"])
                if e is not None:
                    self.entries += 1
                    if self.entries > MAX_TENSORS:
                        raise _Malformed(f"more than {MAX_TENSORS:,} tensors, nanhunter's limit per file")
                    return e
        self.others += len(pairs)
        if self.others > 2 * MAX_TENSORS:
            raise _Malformed(f"more than {2 * MAX_TENSORS:,} JSON fields, nanhunter's limit per file")
        return _Obj(pairs)


def parse_header(raw: bytes, data_len: int, where: str, hint: str) -> Header:
    """Validate header bytes ``raw`` of a file whose data section has ``data_len`` bytes."""

    def bad(msg: str) -> BadInput:
        return BadInput(f"{where}: {msg}; {hint}")

    if raw.startswith(b"\xef\xbb\xbf"):
        raise bad(
            "the header starts with a UTF-8 byte-order mark, which the safetensors format does not allow"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        enc = " (it looks like UTF-16)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in raw[:4] else ""
        raise bad(f"the header is not UTF-8{enc}: invalid byte at offset {e.start}") from None
    if raw.count(b'"data_offsets"') > MAX_TENSORS:  # refuse before parsing: memory stays small
        raise bad(f"more than {MAX_TENSORS:,} tensors, nanhunter's limit per file")
    if nesting_depth(raw, MAX_DEPTH) is None:
        raise bad(f"the header nests JSON deeper than {MAX_DEPTH} levels (or has unbalanced brackets)")
    p = _Parser(bool(_SURROGATE_ESCAPE.search(raw)))
    try:
        top = json.loads(
            text, object_pairs_hook=p.hook, parse_int=_int, parse_float=_float, parse_constant=_constant
        )
    except _Malformed as e:
        raise bad(f"the header is malformed: {e}") from None
    except RecursionError:  # unreachable after the depth check; never an internal error
        raise bad("the header nests JSON too deep") from None
    except ValueError as e:
        raise bad(f"the header is not valid JSON ({str(e).splitlines()[0]})") from None
    if type(top) is not _Obj:
        raise bad("the header is not a JSON object of tensors")
    metadata: dict[str, str] | None = None
    seen_meta = False
    names: set[str] = set()
    entries: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for name, v in top:
        if name == "__metadata__":
            if seen_meta:
                raise bad("'__metadata__' is given twice")
            seen_meta = True
            if v is None:
                continue
            if type(v) is not _Obj or not all(type(x) is str for _, x in v):
                raise bad("'__metadata__' must be a map of strings to strings")
            metadata = dict(v)  # a key repeated inside it: the last one wins, as in the reference
            continue
        if name in names:
            raise bad(f"tensor {show(name)} is given twice")
        names.add(name)
        entry = v if type(v) is _Entry else (_entry(*v) if type(v) is list and len(v) == 3 else None)
        if entry is None:
            raise bad(f"tensor {show(name)}: {_why_not_entry(v)}")
        entries.append((name, *entry))
    del top, names
    entries.sort(key=lambda t: (t[3], t[4]))
    start = 0
    for name, tag, shape, begin, end in entries:
        if begin != start or end < begin:
            how = (
                "ends before it begins"
                if end < begin
                else "overlaps the tensor before it"
                if begin < start
                else f"leaves a gap after byte {start}"
            )
            raise bad(
                f"tensor {show(name)}: data_offsets [{begin}, {end}] {how} (tensors must tile the data section)"
            )
        start = end
        n = 1
        for d in shape:
            n *= d
            if n > _U64_MAX:
                raise bad(f"tensor {show(name)}: shape {show(list(shape))} overflows 64 bits")
        bits = n * DTYPE_BITS[tag]
        if bits > _U64_MAX:
            raise bad(f"tensor {show(name)}: shape {show(list(shape))} {tag} overflows 64 bits")
        if bits % 8:
            raise bad(f"tensor {show(name)}: {n} {tag} elements do not end on a byte boundary")
        if end - begin != bits // 8:
            raise bad(
                f"tensor {show(name)} has {end - begin} bytes for shape {show(list(shape))} {tag} "
                f"({bits // 8} expected)"
            )
    if start > data_len:
        raise bad(f"tensors end at byte {start} but the data section has {data_len} bytes (truncated file)")
    if start < data_len:
        raise bad(f"{data_len - start} bytes follow the last tensor's data (the format allows none)")
    return Header(metadata, entries)
