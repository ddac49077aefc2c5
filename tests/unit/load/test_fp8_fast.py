"""The fp8 fast path (two reductions per piece) gives the histogram's NaN/Inf counts, first index and
absmax exactly, on every 1-byte float tag, with NaN/Inf in some pieces and not others."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.load.weights import scan_tensor

TAGS = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
}


@pytest.mark.parametrize("tag", sorted(TAGS))
@pytest.mark.parametrize("bad", [None, "nan", "inf", "neg"])
def test_fast_equals_histogram(tag, bad, monkeypatch):
    import nan_hunter.load.checkpoint as ckm
    import nan_hunter.load.safetensors_file as sf

    monkeypatch.setattr(sf, "PIECE", 4096)  # many pieces
    g = torch.Generator().manual_seed(hash((tag, bad)) % 1000)
    b = torch.randint(0, 256, (40, 1000), dtype=torch.uint8, generator=g)
    clean = {
        "F8_E4M3": lambda x: (x & 0x7F) == 0x7F,
        "F8_E5M2": lambda x: (x & 0x7F) >= 0x7C,
        "F8_E8M0": lambda x: x == 0xFF,
    }.get(tag, lambda x: x == 0x80)
    b[clean(b)] = 0x11
    if bad == "nan":
        b[33, 7] = {"F8_E4M3": 0xFF, "F8_E5M2": 0x7F, "F8_E8M0": 0xFF}.get(tag, 0x80)
    elif bad == "inf" and tag == "F8_E5M2":
        b[12, 3], b[30, 1] = 0x7C, 0xFC
    elif bad == "neg" and tag != "F8_E8M0":
        b[5, 5] = 0xF0  # a large negative value: the absmax
    t = b.view(TAGS[tag])
    assert ckm  # the .pt path streams the same pieces
    fast, full = scan_tensor("w", t), scan_tensor("w", t, exact=True)
    for k in ("nan", "posinf", "neginf", "first_index", "absmax", "overflows"):
        assert getattr(fast, k) == getattr(full, k), (k, getattr(fast, k), getattr(full, k))
    assert fast.sampled and not full.sampled
