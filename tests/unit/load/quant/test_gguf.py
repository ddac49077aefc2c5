"""GGUF files written by gguf-py (``GGUFWriter``; legacy types and TQ2_0/MXFP4 quantized by gguf-py's own
``quants.quantize``, K- and I-quant blocks as raw bytes with planted fp16 ``d``/``dmin``), the dequantized
absmax against gguf-py's ``quants.dequantize``; bad ``d``/``dmin``, float tensors, the CLI, and a
header that lies (exit 2, one line)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from clirun import invoke

from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.quant.gguf import KINDS
from nan_hunter.load.weights import scan_weights

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

QUANTIZED_BY_GGUF_PY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ2_0", "MXFP4")
RAW_BLOCKS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")


def _raw(tname: str, rows: int, blocks: int, rng) -> np.ndarray:
    """Random blocks of ``tname`` with small positive fp16 d (and dmin): like a real file's scales."""
    _, size = gguf.GGML_QUANT_SIZES[T[tname]]
    raw = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    k = KINDS[tname]
    raw[..., k.d[0] : k.d[0] + 2] = (
        (rng.random((rows, blocks)) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(rows, blocks, 2)
    )
    if k.m is not None:
        raw[..., k.m : k.m + 2] = (
            (rng.random((rows, blocks)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, blocks, 2)
        )
    return raw.reshape(rows, blocks * size)


def write(path, tensors: dict[str, tuple[np.ndarray, str | None]]) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    for name, (arr, tname) in tensors.items():
        if tname is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=T[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _scan(path):
    ws = scan_weights(open_checkpoint(path))
    return ws, {q.name: q for q in ws.quantized}


@pytest.mark.parametrize("tname", QUANTIZED_BY_GGUF_PY + RAW_BLOCKS)
def test_absmax_matches_gguf_py(tmp_path, tname):
    rng = np.random.default_rng(0)
    if tname in QUANTIZED_BY_GGUF_PY:
        x = rng.standard_normal((3, 2, 512)).astype(np.float32)
        x[1, 0, 77] = 9.5
        q = quantize(x, T[tname])
    else:
        q = _raw(tname, 6, 2, rng)
    write(tmp_path / "m.gguf", {"blk.0.w": (q, tname)})
    ws, got = _scan(tmp_path / "m.gguf")
    r = got["blk.0.w"]
    assert r.format == f"gguf:{tname}" and not r.bad_blocks and not ws.unchecked
    assert r.dequant_absmax == pytest.approx(float(np.abs(dequantize(q, T[tname])).max()), rel=1e-6)


def test_bad_d_and_dmin_are_named_in_numpy_order(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    q8 = quantize(x, T.Q8_0)  # [4 rows, 8 blocks x 34 bytes]
    q8 = q8.reshape(4, 8, 34)
    q8[2, 5, :2] = np.array([np.nan], dtype=np.float16).view(np.uint8)
    q8[3, 1, :2] = 0  # d = 0 on a block holding data
    q8[0, 7, :] = 0  # d = 0 and every code 0: an empty block, fine
    k4 = _raw("Q4_K", 2, 3, rng).reshape(2, 3, 144)
    k4[1, 2, 2:4] = np.array([np.inf], dtype=np.float16).view(np.uint8)  # dmin
    k4[0, 0, 0:2] = np.array([-0.5], dtype=np.float16).view(np.uint8)  # a negative d: ggml's convention
    write(
        tmp_path / "m.gguf",
        {
            "a.q8": (q8.reshape(4, 272), "Q8_0"),
            "b.k4": (k4.reshape(2, 432), "Q4_K"),
            "c.f32": (np.array([[1.0, np.nan], [np.inf, 2.0], [3.0, 4.0]], np.float32), None),
        },
    )
    ws, got = _scan(tmp_path / "m.gguf")
    assert got["a.q8"].bad_blocks == [
        {"index": [2, 5], "scale": "nan", "problem": "nan"},
        {"index": [3, 1], "scale": 0.0, "problem": "zero"},
    ]
    assert got["b.k4"].bad_blocks == [{"index": [1, 2], "scale": "inf", "problem": "inf", "field": "dmin"}]
    f32 = next(t for t in ws.tensors if t.name == "c.f32")
    assert (f32.shape, f32.nan, f32.posinf, f32.first_index) == ([3, 2], 1, 1, [0, 1])
    r = invoke("scan", tmp_path / "m.gguf", "--json", tmp_path / "r.json")
    assert r.code == 1, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["checkpoint"]["format"] == "gguf" and rep["run"] is None
    assert rep["weights"]["nonfinite"][0]["name"] == "c.f32"


def test_clean_file_exit_0_and_unchecked_types(tmp_path):
    rng = np.random.default_rng(2)
    iq1m = rng.integers(0, 256, (2, 56), dtype=np.uint8)
    write(
        tmp_path / "m.gguf",
        {
            "a": (quantize(rng.standard_normal((2, 64)).astype(np.float32), T.Q4_0), "Q4_0"),
            "b": (iq1m, "IQ1_M"),
            "c": (rng.standard_normal(8).astype(np.float16), None),
        },
    )
    r = invoke("scan", tmp_path / "m.gguf", "--json", tmp_path / "r.json")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert r.code == 0, r.stderr
    assert [(u["name"], u["dtype"]) for u in rep["weights"]["unchecked"]] == [("b", "gguf:IQ1_M")]
    assert rep["weights"]["quantized"][0]["format"] == "gguf:Q4_0"
    zero = quantize(np.zeros((2, 64), np.float32), T.Q4_0)
    write(tmp_path / "z.gguf", {"a": (zero, "Q4_0")})  # all-zero blocks: d = 0, no data
    assert invoke("scan", tmp_path / "z.gguf").code == 0


def _header(n_tensors=1, n_kv=0, version=3, magic=b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def _info(name=b"w", dims=(32,), ttype=0, offset=0) -> bytes:
    return (
        struct.pack("<Q", len(name))
        + name
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", ttype, offset)
    )


def _file(head: bytes, data: bytes = b"\0" * 128) -> bytes:
    pad = -len(head) % 32
    return head + b"\0" * pad + data


@pytest.mark.parametrize(
    "raw,why",
    [
        (b"GGU", "not a GGUF file"),
        (_file(_header(version=1) + _info()), "version 1"),
        (_file(_header(n_tensors=10**12) + _info()), "tensors"),
        (_file(_header(n_kv=1) + struct.pack("<Q", 2**40)), "over the"),
        (
            _file(_header(n_kv=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99) + _info()),
            "unknown value type",
        ),
        (
            _file(_header(n_kv=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 9, 1) + _info()),
            "array of arrays",
        ),
        (
            _file(_header(n_kv=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 6, 2**50) + _info()),
            "more than",
        ),
        (_file(_header() + _info(dims=(30,), ttype=8)), "whole number"),
        (_file(_header() + _info(ttype=77)), "unknown ggml type"),
        (_file(_header() + _info(dims=(1, 1, 1, 1, 1))), "at most 4"),
        (_file(_header() + _info(offset=64)), "expected 0"),
        (_file(_header() + _info(dims=(4096,))), "truncated"),
        (_file(_header(2) + _info() + _info()), "given twice"),
        (_file(_header() + _info(name=b"x" * 64)), "at most 63"),
        (_file(_header() + _info(name=b"\xff")), "not UTF-8"),
        (_file(_header() + _info(dims=(2**62, 4))), "overflows"),
        (
            _file(
                _header(n_kv=1)
                + struct.pack("<Q", 17)
                + b"general.alignment"
                + struct.pack("<II", 4, 3)
                + _info()
            ),
            "power of two",
        ),
    ],
)
def test_hostile_headers_exit_2_one_line(tmp_path, raw, why):
    p = tmp_path / "h.gguf"
    p.write_bytes(raw)
    with pytest.raises(BadInput) as e:
        open_checkpoint(p)
    assert why in str(e.value) and "\n" not in str(e.value), str(e.value)
    r = invoke("scan", p)
    assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_gguf_with_arch_is_refused(tmp_path):
    write(tmp_path / "m.gguf", {"a": (np.ones(4, np.float32), None)})
    r = invoke("scan", tmp_path / "m.gguf", "--prompt", "hi")
    assert r.code == 2 and "weights-only" in r.stderr
