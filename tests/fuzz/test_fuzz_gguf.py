"""Fuzz the GGUF reader: a file written by gguf-py (metadata of every value type, string arrays, float and
block-quantized tensors), mutated at random (bytes flipped in the header and in the data, u64 counts and
lengths set to extremes, truncation, bytes inserted). Every case ends in a scan (exit 0 or 1) or exit 2 with
one line: never another exception, never a read outside the file, never a hang. Seeded."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

import nan_hunter
from nan_hunter.errors import BadInput

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import quantize  # noqa: E402

SEED = 3434
N = 150
EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, 64, 4096]


def _base(path) -> bytes:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("general.flag", True)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bb"])
    w.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0])
    w.add_tensor("f32", rng.standard_normal((4, 32)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal(64).astype(np.float16))
    for tname in ("Q4_0", "Q8_0"):
        q = quantize(rng.standard_normal((2, 64)).astype(np.float32), T[tname])
        w.add_tensor(tname.lower(), q, raw_shape=q.shape, raw_dtype=T[tname])
    k = rng.integers(0, 256, (1, 144), dtype=np.uint8)
    w.add_tensor("q4k", k, raw_shape=k.shape, raw_dtype=T.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _mutate(raw: bytes, rng: random.Random, header_end: int) -> bytes:
    b = bytearray(raw)
    kind = rng.choice(["flip", "u64", "u32", "truncate", "insert", "data"])
    if kind == "flip":
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(4, header_end)] ^= 1 << rng.randrange(8)
    elif kind in ("u64", "u32"):
        fmt = "<Q" if kind == "u64" else "<I"
        pos = rng.randrange(4, header_end - 8)
        v = rng.choice(EXTREMES) & (0xFFFFFFFF if kind == "u32" else 2**64 - 1)
        b[pos : pos + struct.calcsize(fmt)] = struct.pack(fmt, v)
    elif kind == "truncate":
        del b[rng.randrange(0, len(b)) :]
    elif kind == "insert":
        pos = rng.randrange(4, header_end)
        b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    else:
        for _ in range(8):
            b[rng.randrange(header_end, len(b))] = rng.randrange(256)
    return bytes(b)


def test_mutated_gguf_files(tmp_path):
    raw = _base(tmp_path / "base.gguf")
    header_end = raw.index(b"q4k") + 64  # past the last tensor info
    assert nan_hunter.scan(str(tmp_path / "base.gguf")).exit_code() == 0
    rng = random.Random(SEED)
    codes = []
    for i in range(N):
        p = tmp_path / f"m{i}.gguf"
        p.write_bytes(_mutate(raw, rng, header_end))
        try:
            codes.append(nan_hunter.scan(str(p)).exit_code())
        except BadInput as e:
            assert "\n" not in str(e) and str(e).strip()
            codes.append(2)
    assert set(codes) <= {0, 1, 2}
    assert codes.count(2) > N // 4 and codes.count(2) < N, codes  # both outcomes reached
