"""The safetensors header parser against the reference parser (``safetensors.safe_open``).

Every row is a real file written in tmp_path; the verdict (accepted or refused) must be the
reference's, and a refusal is one line saying what is wrong. The one deliberate difference, a
tensor name given twice, is marked ``STRICTER``.
"""

from __future__ import annotations

import struct

import pytest
import safetensors

from nan_hunter.errors import BadInput
from nan_hunter.load import safetensors_header as safetensors_header
from nan_hunter.load.bounded_json import loads, nesting_depth
from nan_hunter.load.checkpoint import open_safetensors

V = b'"dtype":"F32","shape":[2],"data_offsets":[0,8]'
E8 = b"\0" * 8
OK, ERR, STRICTER = "accepted", "refused", "refused (the reference accepts)"


def st_bytes(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def write(tmp_path, header: bytes, data: bytes = b"", name: str = "t.safetensors"):
    p = tmp_path / name
    p.write_bytes(st_bytes(header, data))
    return p


def reference_verdict(path) -> str:
    try:
        with safetensors.safe_open(str(path), "np") as f:
            list(f.keys())
        return OK
    except Exception:
        return ERR


def our_verdict(path) -> tuple[str, str]:
    try:
        open_safetensors(path)
        return OK, ""
    except BadInput as e:
        return ERR, str(e)


CASES = [
    # (label, header, data, verdict, words the refusal must contain)
    ("valid", b'{"a":{' + V + b"}}", E8, OK, ""),
    (
        "offsets are booleans",
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[false,true]}}',
        E8,
        ERR,
        "data_offsets",
    ),
    (
        "offsets are floats",
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8.0]}}',
        E8,
        ERR,
        "data_offsets",
    ),
    (
        "offsets are strings",
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}}',
        E8,
        ERR,
        "data_offsets",
    ),
    ("negative offset", b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', E8, ERR, "data_offsets"),
    ("-0 is a float", b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]}}', E8, ERR, "data_offsets"),
    ("8e0 is a float", b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8e0]}}', E8, ERR, "data_offsets"),
    ("three offsets", b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', E8, ERR, "data_offsets"),
    (
        "size does not match dtype x shape",
        b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}',
        E8,
        ERR,
        "12 expected",
    ),
    ("tensor name twice", b'{"a":{' + V + b'},"a":{' + V + b"}}", E8, STRICTER, "given twice"),
    ("__metadata__ twice", b'{"__metadata__":{},"__metadata__":{},"a":{' + V + b"}}", E8, ERR, "given twice"),
    ("field twice", b'{"a":{"dtype":"F32",' + V + b"}}", E8, ERR, "'dtype' is given twice"),
    (
        "__metadata__ value not a string",
        b'{"__metadata__":{"x":1},"a":{' + V + b"}}",
        E8,
        ERR,
        "map of strings",
    ),
    ("__metadata__ a list", b'{"__metadata__":["x"],"a":{' + V + b"}}", E8, ERR, "map of strings"),
    ("__metadata__ null", b'{"__metadata__":null,"a":{' + V + b"}}", E8, OK, ""),
    ("UTF-8 byte-order mark", b'\xef\xbb\xbf{"a":{' + V + b"}}", E8, ERR, "byte-order mark"),
    ("UTF-16 header", ('{"a":{' + V.decode() + "}}").encode("utf-16"), E8, ERR, "UTF-16"),
    (
        "5000-digit integer",
        b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,8]}}',
        E8,
        ERR,
        "out of range",
    ),
    ("1e400", b'{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}}', E8, ERR, "out of range"),
    ("Infinity", b'{"a":{"dtype":"F32","shape":[Infinity],"data_offsets":[0,8]}}', E8, ERR, "Infinity"),
    ("NaN", b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[NaN,8]}}', E8, ERR, "NaN"),
    ("nested 100,000 deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", ERR, "deeper than 127"),
    ("opened 100,000 deep", b'{"a":' + b"[" * 100_000, b"", ERR, "deeper than 127"),
    ("extra field nested 127 deep", b'{"a":{' + V + b',"x":' + b"[" * 125 + b"]" * 125 + b"}}", E8, OK, ""),
    (
        "extra field nested 128 deep",
        b'{"a":{' + V + b',"x":' + b"[" * 126 + b"]" * 126 + b"}}",
        E8,
        ERR,
        "deeper",
    ),
    ("unknown dtype", b'{"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}}', E8, ERR, "unknown dtype"),
    (
        "gap before the first tensor",
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
        b"\0" * 16,
        ERR,
        "gap",
    ),
    (
        "overlap",
        b'{"a":{' + V + b'},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        b"\0" * 12,
        ERR,
        "overlaps",
    ),
    (
        "unordered entries",
        b'{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{' + V + b"}}",
        b"\0" * 16,
        OK,
        "",
    ),
    ("bytes after the last tensor", b'{"a":{' + V + b"}}", b"\0" * 16, ERR, "follow the last tensor"),
    ("truncated data", b'{"a":{' + V + b"}}", b"\0" * 4, ERR, "truncated"),
    (
        "shape overflows 64 bits",
        b'{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}',
        b"",
        ERR,
        "overflows",
    ),
    (
        "zero first, no overflow",
        b'{"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}',
        b"",
        OK,
        "",
    ),
    ("F4 packs two per byte", b'{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"\0", OK, ""),
    (
        "F4 off a byte boundary",
        b'{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}',
        b"\0\0",
        ERR,
        "byte boundary",
    ),
    ("extra field ignored", b'{"a":{' + V + b',"note":[1,"x",null]}}', E8, OK, ""),
    ("missing field", b'{"a":{"dtype":"F32","data_offsets":[0,8]}}', E8, ERR, "missing field 'shape'"),
    ("not an object", b"[]", b"", ERR, "not a JSON object"),
    ("entry is a number", b'{"a":{' + V + b'},"b":1}', E8, ERR, "instead of an object"),
    ("lone surrogate escape", b'{"\\ud800":{' + V + b"}}", E8, ERR, "surrogate"),
    ("surrogate pair", b'{"\\ud83d\\ude00":{' + V + b"}}", E8, OK, ""),
    ("escaped backslash, not an escape", b'{"\\\\ud800":{' + V + b"}}", E8, OK, ""),
    ("raw control character", b'{"a\x01":{' + V + b"}}", E8, ERR, "not valid JSON"),
    ("trailing characters", b'{"a":{' + V + b"}}\0\0", E8, ERR, "not valid JSON"),
    ("brackets inside a name", b'{"a[[[[{{":{' + V + b"}}", E8, OK, ""),
    ("entry in serde's list form", b'{"a":["F32",[2],[0,8]]}', E8, OK, ""),
    (
        "dtype in serde's map form",
        b'{"a":{"dtype":{"F32":null},"shape":[2],"data_offsets":[0,8]}}',
        E8,
        OK,
        "",
    ),
    ("overlong UTF-8", b'{"a\xc0\xaf":{' + V + b"}}", E8, ERR, "not UTF-8"),
    ("empty header", b"", b"", ERR, "not valid JSON"),
]


@pytest.mark.parametrize("label,header,data,verdict,needle", CASES, ids=[c[0] for c in CASES])
def test_verdict_matches_the_reference(tmp_path, label, header, data, verdict, needle):
    p = write(tmp_path, header, data)
    ours, msg = our_verdict(p)
    assert ours == (ERR if verdict == STRICTER else verdict), msg
    assert reference_verdict(p) == (OK if verdict == STRICTER else verdict)
    if ours == ERR:
        assert "\n" not in msg and needle.lower() in msg.lower(), msg
        assert str(p) in msg


def test_header_length_limits(tmp_path):
    p = tmp_path / "big.safetensors"
    p.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    assert "over the safetensors limit of 100000000" in our_verdict(p)[1]
    p.write_bytes(struct.pack("<Q", 64) + b"{}")
    assert "does not fit" in our_verdict(p)[1]
    p.write_bytes(b"abc")
    assert "too short" in our_verdict(p)[1]


def test_tensor_limit_refuses_before_parsing(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_header, "MAX_TENSORS", 10)

    def entries(n: int) -> bytes:
        return b",".join(b'"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(n))

    p = write(tmp_path, b"{" + entries(11) + b"}")
    assert "more than 10 tensors" in our_verdict(p)[1]
    # the field name escaped: the quick count misses it, the parser's own count does not
    escaped = entries(11).replace(b'"data_offsets"', b'"\\u0064ata_offsets"')
    p = write(tmp_path, b"{" + escaped + b"}")
    assert "more than 10 tensors" in our_verdict(p)[1]
    p = write(tmp_path, b"{" + entries(10) + b"}")  # ten tensors: fine
    assert our_verdict(p)[0] == OK


def test_entries_keep_names_dtypes_shapes_and_offsets(tmp_path):
    h = (
        b'{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},'
        b'"s":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}'
    )
    ck = open_safetensors(write(tmp_path, h, b"\0" * 16))
    w, s = ck.entries["w"], ck.entries["s"]
    assert (w.dtype, w.shape, w.begin, w.end, w.numel) == ("BF16", (2, 3), 4, 16, 6)
    assert (s.dtype, s.shape, s.nbytes) == ("I32", (), 4)
    assert ck._files[ck.path].metadata == {"format": "pt"}


@pytest.mark.parametrize(
    "text,depth",
    [
        (b"{}", 1),
        (b"[[],[[]]]", 3),
        (b'{"a":"[[[["}', 1),
        (b'{"a\\"[":[1]}', 2),
        (b"1", 0),
        (b"[" * 200 + b"]" * 200, None),
    ],
)
def test_nesting_depth(text, depth):
    assert nesting_depth(text, 127) == depth


def test_bounded_loads_refuses_depth_duplicates_and_constants():
    with pytest.raises(BadInput, match="deeper than 127"):
        loads(b"[" * 100_000 + b"]" * 100_000, "x")
    with pytest.raises(BadInput, match="'a' is given twice"):
        loads(b'{"a":1,"a":2}', "x", unique_keys=True)
    with pytest.raises(BadInput, match="NaN is not valid JSON"):
        loads(b"[NaN]", "x")
    assert loads(b'{"a":[1,{"b":null}]}', "x") == {"a": [1, {"b": None}]}
