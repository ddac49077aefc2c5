"""Every safetensors dtype is checked from its bits (contract v1.2 "Every checkpoint format"): one
test per dtype, from raw bytes where torch cannot write the dtype."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.config import default_config
from nan_hunter.explain.weights_verdict import weights_section as weights_block
from nan_hunter.load.bit_dtypes import code_values
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights
from nan_hunter.load.weights_sections import weights_sections
from nan_hunter.render.rows import verdict
from nan_hunter.report import Report

from .raw_safetensors import write_raw


def _scan(path):
    ws = scan_weights(open_checkpoint(path))
    return ws, {t.name: t for t in ws.tensors}


@pytest.mark.parametrize(
    "tag,nan_byte,top",
    [("F8_E4M3FNUZ", 0x80, 240.0), ("F8_E5M2FNUZ", 0x80, 57344.0), ("F8_E8M0", 0xFF, 2.0**127)],
)
def test_fp8_variants_nan_from_bits(tmp_path, tag, nan_byte, top):
    raw = bytes([0x00, 0x3C, nan_byte, 0x7F if tag != "F8_E8M0" else 0xFE, nan_byte, 0x01])
    p = write_raw(tmp_path / "w.safetensors", {"w": (tag, [2, 3], raw), "ok": (tag, [2], bytes([1, 2]))})
    ws, t = _scan(p)
    assert t["w"].nan == 2 and t["w"].first_index == [0, 2]
    assert t["w"].absmax == max(abs(code_values(tag)[b]) for b in raw if b != nan_byte)
    assert t["ok"].nan == 0 and t["ok"].absmax is not None
    assert not ws.unchecked
    # the format's largest finite code gives the format's max
    big = {"F8_E4M3FNUZ": 0x7F, "F8_E5M2FNUZ": 0x7F, "F8_E8M0": 0xFE}[tag]
    p2 = write_raw(tmp_path / "m.safetensors", {"m": (tag, [1], bytes([big]))})
    assert _scan(p2)[1]["m"].absmax == top


def test_torch_reads_the_same_values():
    for tag, dt in (
        ("F8_E4M3FNUZ", torch.float8_e4m3fnuz),
        ("F8_E5M2FNUZ", torch.float8_e5m2fnuz),
        ("F8_E4M3", torch.float8_e4m3fn),
        ("F8_E5M2", torch.float8_e5m2),
        ("F8_E8M0", torch.float8_e8m0fnu),
    ):
        ref = torch.arange(256, dtype=torch.uint8).view(dt).float().tolist()
        ours = code_values(tag)
        assert all((a != a and b != b) or a == b for a, b in zip(ref, ours)), tag


def test_f8_e4m3_nan_is_s1111111(tmp_path):
    t = torch.zeros(4, dtype=torch.uint8)
    t[1], t[3] = 0x7F, 0xFF  # S.1111.111: the only NaN codes of e4m3fn
    t[2] = 0x7E  # 448, the max
    save_file({"w": t.view(torch.float8_e4m3fn)}, str(tmp_path / "w.safetensors"))
    _, s = _scan(tmp_path / "w.safetensors")
    assert s["w"].nan == 2 and s["w"].first_index == [1] and s["w"].absmax == 448.0


def test_f4_no_nan_encoding_absmax_from_nibbles(tmp_path):
    # E2M1: nibble 0x7 is 6.0, 0xF is -6.0, 0x1 is 0.5; no code is NaN or Inf
    p = write_raw(tmp_path / "w.safetensors", {"w": ("F4", [2, 4], bytes([0x10, 0xF1, 0x00, 0x21]))})
    ws, t = _scan(p)
    assert t["w"].nan == 0 and t["w"].finite and t["w"].absmax == 6.0 and not t["w"].skipped
    assert not ws.unchecked
    assert sorted(abs(v) for v in code_values("F4"))[-1] == 6.0


@pytest.mark.parametrize("tag,top", [("F6_E2M3", 7.5), ("F6_E3M2", 28.0)])
def test_f6_no_nan_encoding_absmax_from_codes(tmp_path, tag, top):
    # four 6-bit codes per 3 bytes, little-endian word: code 0x1F (max magnitude) in element 1
    w = 0x1F << 6 | 0x01
    raw = w.to_bytes(3, "little") + bytes(3)
    p = write_raw(tmp_path / "w.safetensors", {"w": (tag, [2, 4], raw)})
    ws, t = _scan(p)
    assert t["w"].finite and t["w"].absmax == top and not ws.unchecked
    assert max(abs(v) for v in code_values(tag)) == top


def test_unchecked_is_listed_and_the_verdict_says_so(tmp_path):
    p = write_raw(tmp_path / "w.safetensors", {"c": ("C64", [2], bytes(16)), "f": ("F32", [1], bytes(4))})
    ws, _ = _scan(p)
    assert ws.unchecked == [
        {"name": "c", "dtype": "complex64", "reason": "dtype complex64 is not scanned (complex)"}
    ]
    block = weights_block(ws, default_config())
    assert block["unchecked"] == weights_sections(ws)["unchecked"]
    v = verdict(Report(weights=block))
    assert "1 tensor not checked" in v.text and v.tone == "warn"


def test_fnuz_nan_fails_the_verdict(tmp_path):
    p = write_raw(tmp_path / "w.safetensors", {"w": ("F8_E4M3FNUZ", [2], bytes([0x80, 0x01]))})
    ws, _ = _scan(p)
    rep = Report(weights=weights_block(ws, default_config()))
    assert rep.exit_code() == 1 and verdict(rep).tone == "bad"


def test_pt_checkpoint_fnuz_checked(tmp_path):
    t = torch.tensor([0, 0x80], dtype=torch.uint8).view(torch.float8_e4m3fnuz)
    torch.save({"w": t}, tmp_path / "w.pt")
    _, s = _scan(tmp_path / "w.pt")
    assert s["w"].nan == 1 and s["w"].first_index == [1]


def test_f8_e5m2_inf_and_nan_from_bits(tmp_path):
    t = torch.tensor([0x7C, 0xFC, 0x7D, 0x3C], dtype=torch.uint8)  # +inf, -inf, NaN, 1.0
    save_file({"w": t.view(torch.float8_e5m2)}, str(tmp_path / "w.safetensors"))
    _, s = _scan(tmp_path / "w.safetensors")
    assert (s["w"].nan, s["w"].posinf, s["w"].neginf, s["w"].first_index, s["w"].absmax) == (
        1,
        1,
        1,
        [0],
        1.0,
    )


def test_pieces_keep_packed_groups_and_first_index(tmp_path, monkeypatch):
    """Small pieces: F6 groups of 3 bytes are never split, and the first NaN's index counts the
    pieces before it."""
    import nan_hunter.load.safetensors_file as sf

    w = (0x1F << 18 | 0x01).to_bytes(3, "little")  # element 3 holds the max code
    f6 = bytes(3) * 700 + w + bytes(3) * 299  # 4000 elements
    fnuz = bytearray(5000)
    fnuz[4321] = 0x80
    p = write_raw(
        tmp_path / "w.safetensors", {"a": ("F6_E3M2", [4000], f6), "b": ("F8_E4M3FNUZ", [5000], bytes(fnuz))}
    )
    monkeypatch.setattr(sf, "PIECE", 1024)
    monkeypatch.setattr(sf, "WINDOW", 2048)
    _, t = _scan(p)
    assert t["a"].absmax == 28.0 and t["a"].finite
    assert t["b"].nan == 1 and t["b"].first_index == [4321]


FP8_TORCH = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
}


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
@pytest.mark.parametrize("tag", sorted(FP8_TORCH))
def test_every_fp8_code_as_torch_reads_it(tmp_path, tag, exact):
    """All 256 codes of each 1-byte float (e4m3 NaN 0x7F/0xFF, e5m2 ±Inf 0x7C/0xFC and its NaNs, FNUZ's
    0x80, E8M0's 0xFF), scanned with numpy from their bits, against torch's own float8 decoding: counts,
    first index, absmax, and the fp16 underflow of the finite values."""
    codes = torch.arange(256, dtype=torch.uint8).roll(37)  # the first NaN away from index 0
    t = codes.view(FP8_TORCH[tag]).reshape(16, 16)
    # from raw bytes: safetensors' writer at the floor (0.7.0) cannot save the FNUZ dtypes (KeyError)
    p = write_raw(tmp_path / "w.safetensors", {"w": (tag, [16, 16], codes.numpy().tobytes())})
    got = {s.name: s for s in scan_weights(open_checkpoint(p), exact=exact).tensors}["w"]
    v = t.float().reshape(-1)
    fin = torch.isfinite(v)
    first = int((~fin).nonzero()[0])
    assert (got.nan, got.posinf, got.neginf) == (
        int(v.isnan().sum()),
        int((v == math.inf).sum()),
        int((v == -math.inf).sum()),
    )
    assert got.first_index == [first // 16, first % 16]
    assert got.absmax == float(v[fin].abs().max())
    a = v[fin].abs()
    n = a.numel()
    assert got.fp16_zero_frac == int(((a > 0) & (a < 2.0**-25)).sum()) / n
    assert got.fp16_subnormal_frac == int(((a >= 2.0**-25) & (a < 2.0**-14)).sum()) / n
    assert got.min_nonzero == float(a[a > 0].min())


def test_every_f4_pair_against_the_e2m1_table(tmp_path):
    """F4 (OCP E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), all 256 bytes (every pair of codes):
    no NaN or Inf, absmax 6, smallest non-zero 0.5, nothing flushed or subnormal in fp16."""
    p = write_raw(tmp_path / "w.safetensors", {"w": ("F4", [16, 32], bytes(range(256)))})
    for exact in (False, True):
        got = {s.name: s for s in scan_weights(open_checkpoint(p), exact=exact).tensors}["w"]
        assert got.finite and got.absmax == 6.0 and got.min_nonzero == 0.5
        assert got.fp16_zero_frac == 0.0 and got.fp16_subnormal_frac == 0.0
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert list(code_values("F4")) == e2m1 + [-x for x in e2m1]
