"""load/gguf_file.py: a GGUF header validated before anything is read — magic, little-endian version
2 or 3, bounded counts, unique keys and names, a power-of-two alignment, known ggml types, whole
blocks, each tensor following the one before inside the file — then read like a safetensors file."""

from __future__ import annotations

import io
import re
import struct

import pytest
import torch

from nan_hunter.errors import BadInput
from nan_hunter.load.gguf_file import GGML_TYPES, MAX_NAME, GgufFile, ggml_type, parse_gguf


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf(
    tensors: list[tuple[str, list[int], int, bytes]],
    kv: list[tuple[str, int, bytes]] = (),
    alignment: int = 32,
    version: int = 3,
    offsets: list[int] | None = None,
    cut: int = 0,
) -> bytes:
    """A GGUF file: ``tensors`` as (name, ggml dims, type id, data), ``kv`` as (key, type id, packed value)."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, value in kv:
        head += _str(key) + struct.pack("<I", vtype) + value
    off, offs = 0, []
    for _, _, _, data in tensors:
        offs.append(off)
        off += -(-len(data) // alignment) * alignment
    for (name, dims, ttype, _), o in zip(tensors, offsets or offs):
        head += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", ttype, o)
    head += b"\0" * (-len(head) % alignment)
    body = b"".join(d + b"\0" * (-len(d) % alignment) for _, _, _, d in tensors)
    out = head + body
    return out[: len(out) - cut] if cut else out


F32 = 0


def _parse(raw: bytes):
    return parse_gguf(io.BytesIO(raw), len(raw), "m.gguf")


def test_a_valid_header():
    data = struct.pack("<6f", *range(6))
    h = _parse(
        gguf(
            [("w", [3, 2], F32, data)],
            kv=[("general.architecture", 8, _str("llama")), ("general.alignment", 4, struct.pack("<I", 32))],
        )
    )
    assert (h.version, h.alignment, h.architecture) == (3, 32, "llama")
    assert h.tensors == [("w", "F32", (2, 3), 0, 24)]  # numpy order: ggml's dims reversed
    assert h.data_start % 32 == 0


@pytest.mark.parametrize(
    "raw, says",
    [
        (b"GGML" + b"\0" * 40, "not a GGUF file (no 'GGUF' magic)"),
        (gguf([], version=1), "GGUF version 1: nanhunter reads little-endian versions 2 and 3"),
        (gguf([], version=0x03000000), "(it looks big-endian)"),
        (
            gguf([], kv=[("a", 4, struct.pack("<I", 1)), ("a", 4, struct.pack("<I", 1))]),
            "metadata key 'a' is given twice",
        ),
        (
            gguf([], kv=[("general.alignment", 4, struct.pack("<I", 24))]),
            "general.alignment is 24: ggml needs a power of two",
        ),
        (gguf([("w", [4], 99, b"\0" * 16)]), "tensor 'w' has unknown ggml type 99"),
        (gguf([("w", [4], F32, b"\0" * 16), ("w", [4], F32, b"\0" * 16)]), "tensor 'w' is given twice"),
        (gguf([("w", [1, 1, 1, 1, 1], F32, b"\0" * 4)]), "has 5 dims; ggml allows at most 4"),
        (gguf([("x" * (MAX_NAME + 1), [1], F32, b"\0" * 4)]), f"ggml allows at most {MAX_NAME}"),
        (gguf([("w", [33], 2, b"\0" * 18)]), "first dim 33 is not a whole number of Q4_0 blocks of 32"),
        (
            gguf([("w", [4], F32, b"\0" * 16), ("v", [4], F32, b"\0" * 16)], offsets=[0, 64]),
            "tensor 'v' has offset 64, expected 32",
        ),
        (gguf([("w", [64], F32, b"\0" * 256)], cut=100), "(truncated file)"),
    ],
)
def test_refused_in_one_line(raw, says):
    with pytest.raises(BadInput, match=re.escape(says)) as e:
        _parse(raw)
    assert "\n" not in str(e.value) and str(e.value).startswith("m.gguf")


@pytest.mark.parametrize(
    "tag, t",
    [
        ("GGUF_Q4_K", ("Q4_K", 256, 144)),
        ("GGUF_MXFP4", ("MXFP4", 32, 17)),
        ("F32", None),
        ("GGUF_NOPE", None),
    ],
)
def test_ggml_type(tag, t):
    assert ggml_type(tag) == t


def test_every_block_type_has_whole_bytes():
    assert all(blck >= 1 and size >= 1 for _, blck, size in GGML_TYPES.values())


def test_read_like_a_safetensors_file(tmp_path):
    w = torch.arange(6, dtype=torch.float32)
    q = b"\x01" * 18  # one Q4_0 block
    p = tmp_path / "m.gguf"
    p.write_bytes(gguf([("w", [3, 2], F32, w.numpy().tobytes()), ("q", [32], 2, q)]))
    f = GgufFile(p)
    assert set(f.entries) == {"w", "q"} and f.entries["q"].dtype == "GGUF_Q4_0"
    assert f.metadata == {"gguf_version": "3", "alignment": "32"}
    assert torch.equal(f.read_tensor(f.entries["w"]), w.reshape(2, 3))
