"""nan_hunter/load/float_bits.py through the weights scan: F64, F32, F16 and BF16 tensors read from their
bits with numpy give what torch says of the same values: NaN (every payload, both signs), ±Inf,
subnormals, −0, the largest finite, the fp16 flush and subnormal bounds; across pieces, cache slices
and exact-count chunks (shrunk here so that small tensors cross them), sampled and exact.

The expectations are computed with torch's own float arithmetic, sharing no code with the scan."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import nan_hunter.load.float_bits as fbits
import nan_hunter.load.safetensors_file as sf
import nan_hunter.load.weights as weights
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.float_bits import FLOATS, exact_counts, top_magnitude
from nan_hunter.load.weights import SAMPLE, scan_weights

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _from_bits(dtype: torch.dtype, bits: list[int]) -> torch.Tensor:
    width = torch.finfo(dtype).bits
    signed = [b - (1 << width) if b >> (width - 1) else b for b in bits]
    return torch.tensor(signed, dtype=INT_VIEW[dtype]).view(dtype)


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """The named edge cases of ``dtype``, by bit pattern, each sign."""
    fi = torch.finfo(dtype)
    width, man = fi.bits, int(round(-math.log2(fi.eps)))
    exp = width - 1 - man
    sign, inf = 1 << (width - 1), ((1 << exp) - 1) << man
    named = {
        "+0": 0,
        "-0": sign,
        "smallest subnormal": 1,
        "largest subnormal": (1 << man) - 1,
        "smallest normal": 1 << man,
        "max finite": inf - 1,
        "+inf": inf,
        "quiet NaN": inf | (1 << (man - 1)),
        "signalling NaN": inf | 1,
        "largest NaN payload": inf | ((1 << man) - 1),
    }
    bits = [b | s for b in named.values() for s in (0, sign)]
    plain = torch.tensor(
        [
            2.0**-25,
            2.0**-25 * 1.001,
            2.0**-25 * 0.999,
            2.0**-14,
            1e-30,
            1.0,
            448.0,
            449.0,
            65504.0,
            65520.0,
            57344.0,
            1e300 if dtype == torch.float64 else 3.0,
        ],
        dtype=torch.float64,
    )
    return torch.cat([_from_bits(dtype, bits), plain.to(dtype), -plain.to(dtype)])


def expected(t: torch.Tensor, exact: bool) -> dict:
    """What the scan must report for ``t``, computed with torch."""
    x = t.reshape(-1)
    d = x.double()
    bad = ~torch.isfinite(d)
    out = {
        "nan": int(torch.isnan(d).sum()),
        "posinf": int((d == math.inf).sum()),
        "neginf": int((d == -math.inf).sum()),
        "first_index": [int(i) for i in np.unravel_index(int(bad.nonzero()[0]), tuple(t.shape))]
        if bad.any()
        else None,
        "absmax": float(d[~bad].abs().max()) if (~bad).any() else 0.0,
    }
    if t.dtype == torch.float16 and not exact:  # already fp16: no underflow pass
        return {
            **out,
            "fp16_zero_frac": 0.0,
            "fp16_subnormal_frac": None,
            "min_nonzero": None,
            "sampled": False,
        }
    n = x.numel()
    step = n // SAMPLE if not exact and n > SAMPLE else 0
    a = (x[::step][:SAMPLE] if step else x).float().abs()  # the values as float32 (F64 rounded, as cast)
    fin = torch.isfinite(a)
    nz = fin & (a > 0)
    k = int(fin.sum())
    flush = int((nz & (a < 2.0**-25)).sum())
    sub = int((fin & (a >= 2.0**-25) & (a < 2.0**-14)).sum())
    return {
        **out,
        "fp16_zero_frac": flush / k if k else 0.0,
        "fp16_subnormal_frac": sub / k if k else 0.0,
        "min_nonzero": float(a[nz].min()) if nz.any() else None,
        "sampled": bool(step),
    }


def _scan(tmp_path, tensors: dict[str, torch.Tensor], exact: bool):
    f = tmp_path / "w.safetensors"
    save_file(tensors, str(f))
    return {t.name: t for t in scan_weights(open_checkpoint(f), exact=exact).tensors}


def _check(got, t: torch.Tensor, exact: bool) -> None:
    want = expected(t, exact)
    for k, v in want.items():
        assert getattr(got, k) == v, (got.name, k, getattr(got, k), v)
    assert got.overflows["fp16"] == (want["absmax"] > 65504)


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
@pytest.mark.parametrize("tag", list(DTYPES))
def test_edge_values_equal_torch(tmp_path, tag, exact):
    dt = DTYPES[tag]
    e = edge_values(dt)
    finite = e[torch.isfinite(e.double())]
    tensors = {
        "edges": e.reshape(2, -1),
        "finite": finite,
        "all_nan": torch.full((3,), math.nan, dtype=dt),
        "one_neg_inf": torch.tensor([-math.inf], dtype=dt),
    }
    got = _scan(tmp_path, tensors, exact)
    for name, t in tensors.items():
        _check(got[name], t, exact)
    assert got["all_nan"].nan == 3 and got["all_nan"].absmax == 0.0  # no finite value: absmax 0, as before


@pytest.mark.parametrize("tag", list(DTYPES))
def test_pieces_slices_and_chunks_add_up(tmp_path, tag, monkeypatch):
    """NaN/Inf on both sides of piece, cache-slice and exact-chunk boundaries (all shrunk), in a tensor
    large enough to be sampled: counts, first index and absmax as torch has them over the whole."""
    monkeypatch.setattr(sf, "PIECE", 4096)
    monkeypatch.setattr(fbits, "CACHE_BYTES", 256)
    monkeypatch.setattr(fbits, "CHUNK", 1000)
    monkeypatch.setattr(weights, "CHUNK", 1000)
    dt = DTYPES[tag]
    g = torch.Generator().manual_seed(7)
    t = (torch.randn(70_000, generator=g, dtype=torch.float64) * 100).to(dt)
    t[::9] = (torch.rand(t[::9].shape, generator=g, dtype=torch.float64) * 1e-6).to(dt)
    for i, v in ((999, math.nan), (1000, math.inf), (2047, -math.inf), (2048, math.nan), (69_999, -math.inf)):
        t[i] = v
    t[5000] = torch.finfo(dt).max if dt != torch.float64 else 1e300  # the absmax, in a finite chunk
    for exact in (False, True):
        got = _scan(tmp_path, {"w": t.reshape(7, -1)}, exact)["w"]
        _check(got, t.reshape(7, -1), exact)


@pytest.mark.parametrize("tag", list(FLOATS))
def test_top_magnitude_and_exact_counts_on_bits(tag):
    """The two primitives on raw bits: the largest magnitude (any sign, NaN included) and exact counts."""
    dt = DTYPES[tag]
    fb = FLOATS[tag]
    e = edge_values(dt)
    bits = e.view(INT_VIEW[dt]).numpy().view(fb.unsigned)
    assert top_magnitude(fb, bits) == (1 << (fb.width - 1)) - 1  # the negative NaN of largest payload
    nan, posinf, neginf, first, best = exact_counts(fb, bits)
    d = e.double()
    assert (nan, posinf, neginf) == (
        int(d.isnan().sum()),
        int((d == math.inf).sum()),
        int((d == -math.inf).sum()),
    )
    assert first == int((~torch.isfinite(d)).nonzero()[0])
    assert fb.value(best) == float(d[torch.isfinite(d)].abs().max())
    assert top_magnitude(fb, bits[:0]) == -1


def test_f64_absmax_stays_exact_beside_nan(tmp_path):
    """A deliberate difference from the torch path it replaced, which rounded the absmax of an F64 tensor
    holding NaN/Inf through float32 (1e300 became inf, reported as null with headroom 0): exact now."""
    t = torch.tensor([1e300, math.nan, 0.5], dtype=torch.float64)
    got = _scan(tmp_path, {"w": t}, False)["w"]
    assert (
        got.nan == 1
        and got.absmax == 1e300
        and got.overflows["fp16"]
        and got.headroom["fp16"] == 65504 / 1e300
    )


def test_scan_reads_pieces_without_writing_or_copying(tmp_path):
    """The pieces the scan gets are read-only views of the map (numpy would refuse a write)."""
    f = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(10)}, str(f))
    items = open_checkpoint(f).scan_items()  # kept: the file stays open while its items are read
    _, _, piece = next(next(items).pieces)
    assert isinstance(piece, np.ndarray) and not piece.flags.writeable and not piece.flags.owndata
    with pytest.raises(ValueError):
        piece[0] = 2
