"""Writes ``edge_cases.safetensors``: every dtype tag safetensors has, with the values a weights scan
must get right, written from their bits (numpy and the format's own layout, no torch).

- F64, F32, F16, BF16: ±0, the smallest and largest subnormals, the smallest normal, ±1, the largest
  finite, ±Inf, NaNs (quiet, signalling, negative, largest payload), the values around fp16's flush
  and subnormal bounds (2^-25, 2^-14), fp16's max and the first value that rounds to fp16 Inf, e4m3's
  max and past it; once with the non-finite values (``.edges``) and once without (``.finite``); a
  70,000-element F32 and BF16 tensor (more than the scan's 65,536-element underflow sample) with a
  NaN and a −Inf planted (``.big``) and a finite BF16 one (``.big_finite``);
- the five 1-byte float tags: all 256 codes (``.codes``) and the finite ones only (``.finite``);
- F4 (all 256 bytes: every pair of E2M1 codes), F6_E2M3 and F6_E3M2 (all 64 codes);
- every integer tag, BOOL and C64 (not floating point, or complex: skipped), an empty F32 tensor.

``python tests/data/dtypes/make_edge_cases.py`` rewrites the file; its bytes are committed, so the
reports tests compare (``tests/data/weights_reference.json``) are of these exact bytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

#: tag → (unsigned bits dtype, exponent bits, mantissa bits)
FLOATS = {"F64": ("<u8", 11, 52), "F32": ("<u4", 8, 23), "F16": ("<u2", 5, 10), "BF16": ("<u2", 8, 7)}


def _bits_of(tag: str, values: list[float]) -> np.ndarray:
    """Finite values (and ±inf) of ``tag`` as its bits: through float64/float32/float16; BF16 as the
    top half of float32 (the values listed are exact in bf16)."""
    if tag == "F64":
        return np.array(values, dtype="<f8").view("<u8")
    if tag == "F32":
        return np.array(values, dtype="<f4").view("<u4")
    if tag == "F16":
        return np.array(values, dtype="<f2").view("<u2")
    return (np.array(values, dtype="<f4").view("<u4") >> 16).astype("<u2")


def float_edges(tag: str) -> tuple[np.ndarray, np.ndarray]:
    udt, e, m = FLOATS[tag]
    width = np.dtype(udt).itemsize * 8
    sign = 1 << (width - 1)
    inf = ((1 << e) - 1) << m
    mag = [0, 1, (1 << m) - 1, 1 << m, inf - 1]  # 0, smallest/largest subnormal, smallest normal, max finite
    finite_bits = [b for x in mag for b in (x, x | sign)]  # each with both signs (-0 included)
    around = [
        2.0**-25,
        2.0**-25 * (1 + 2.0**-10),
        2.0**-25 * (1 - 2.0**-8),
        2.0**-14,
        2.0**-14 * (1 - 2.0**-8),
        1e-30,
        1.0,
        -1.0,
        3.0,
        448.0,
        464.0,
        -65504.0,
        65520.0,
        57344.0,
    ]
    keep = [v for v in around if tag != "F16" or abs(v) <= 65504]  # F16 holds no 65520
    if tag == "F16":
        keep = [v for v in keep if abs(v) >= 2.0**-24 or v == 0]  # below its subnormals: not an F16 value
    finite = np.concatenate([np.array(finite_bits, dtype=udt), _bits_of(tag, keep)])
    nans = [inf | (1 << (m - 1)), inf | 1, sign | inf | (1 << (m - 1)), sign | inf | ((1 << m) - 1)]
    bad = np.array([inf, sign | inf, *nans], dtype=udt)
    edges = np.concatenate([finite[:5], bad[:3], finite[5:], bad[3:]])
    return edges, finite


def big(tag: str, planted: bool) -> np.ndarray:
    rng = np.random.default_rng(36)
    v = (rng.standard_normal(70_000) * np.where(rng.random(70_000) < 0.3, 1e-6, 1.0)).tolist()
    b = _bits_of(tag, v) if tag != "F16" else np.array(v, dtype="<f2").view("<u2")
    if planted:
        udt, e, m = FLOATS[tag]
        inf = ((1 << e) - 1) << m
        b = b.copy()
        b[65_537] = inf | 1  # a NaN past the sample's stride
        b[69_999] = (1 << (np.dtype(udt).itemsize * 8 - 1)) | inf  # -inf, the last element
    return b


def tensors() -> dict[str, tuple[str, list[int], bytes]]:
    out: dict[str, tuple[str, list[int], bytes]] = {}
    for tag in FLOATS:
        edges, finite = float_edges(tag)
        out[f"float.{tag}.edges"] = (tag, [edges.size], edges.tobytes())
        out[f"float.{tag}.finite"] = (tag, [finite.size], finite.tobytes())
    out["float.F32.big"] = ("F32", [70, 1000], big("F32", True).tobytes())
    out["float.BF16.big"] = ("BF16", [70, 1000], big("BF16", True).tobytes())
    out["float.BF16.big_finite"] = ("BF16", [70_000], big("BF16", False).tobytes())
    codes = np.arange(256, dtype=np.uint8)
    bad = {
        "F8_E4M3": lambda c: (c & 0x7F) == 0x7F,
        "F8_E5M2": lambda c: (c & 0x7F) >= 0x7C,
        "F8_E4M3FNUZ": lambda c: c == 0x80,
        "F8_E5M2FNUZ": lambda c: c == 0x80,
        "F8_E8M0": lambda c: c == 0xFF,
    }
    for tag, is_bad in bad.items():
        out[f"fp8.{tag}.codes"] = (tag, [16, 16], codes.tobytes())
        fin = codes[~is_bad(codes)]
        out[f"fp8.{tag}.finite"] = (tag, [fin.size], fin.tobytes())
    out["fp4.F4.pairs"] = ("F4", [16, 32], codes.tobytes())
    six = np.arange(64, dtype=np.uint32).reshape(16, 4)
    words = six[:, 0] | (six[:, 1] << 6) | (six[:, 2] << 12) | (six[:, 3] << 18)
    packed = np.stack([words & 0xFF, (words >> 8) & 0xFF, (words >> 16) & 0xFF], axis=1).astype(np.uint8)
    for tag in ("F6_E2M3", "F6_E3M2"):
        out[f"fp6.{tag}.codes"] = (tag, [64], packed.tobytes())
    for tag, dt in (
        ("I8", "i1"),
        ("U8", "u1"),
        ("I16", "<i2"),
        ("U16", "<u2"),
        ("I32", "<i4"),
        ("U32", "<u4"),
        ("I64", "<i8"),
        ("U64", "<u8"),
    ):
        out[f"int.{tag}"] = (tag, [3], np.array([0, 1, 2], dtype=dt).tobytes())
    out["other.BOOL"] = ("BOOL", [2], b"\x00\x01")
    out["other.C64"] = ("C64", [2], np.array([1 + 2j, np.nan], dtype="<c8").tobytes())
    out["other.empty"] = ("F32", [0, 3], b"")
    return out


def write(path: Path) -> None:
    header: dict = {}
    data = b""
    for name, (tag, shape, raw) in tensors().items():
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


if __name__ == "__main__":
    write(HERE / "edge_cases.safetensors")
