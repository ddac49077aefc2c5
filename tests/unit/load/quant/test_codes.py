"""load/quant/codes.py: codes from raw bytes — fp8/fp4 magnitudes (NaN/Inf codes as 0), block
maxima with zero padding, fp4 nibble pairs, little-endian packed integers of any width, and fp16/
fp32/E8M0 fields decoded."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.load.quant.codes import (
    decode_e8m0,
    decode_f16,
    decode_f32,
    fp4_mag_table,
    fp4_pair_mags,
    fp8_block_mags,
    fp8_mag_table,
    reduce_blocks,
    unpack_bits,
)


@pytest.mark.parametrize("tag, dtype, top", [("F8_E4M3", torch.float8_e4m3fn, 448.0),
                                             ("F8_E5M2", torch.float8_e5m2, 57344.0)])
def test_fp8_magnitudes_match_torch(tag, dtype, top):
    table = fp8_mag_table(tag)
    codes = torch.arange(128, dtype=torch.uint8)
    want = codes.view(dtype).float().abs()
    finite = torch.isfinite(want)
    assert torch.equal(table[finite], want[finite]) and (table[~finite] == 0).all()
    assert float(table.max()) == top


def test_fp4_magnitudes():
    assert fp4_mag_table().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_reduce_blocks_pads_with_zeros():
    m = torch.tensor([[1, 9, 2], [3, 4, 5], [8, 0, 0]], dtype=torch.int32)
    assert reduce_blocks(m, 2, 2).tolist() == [[9, 5], [8, 0]]
    assert torch.equal(reduce_blocks(m, 1, 1), m)


def test_fp8_block_maxima_against_the_values():
    torch.manual_seed(0)
    w = (torch.randn(5, 7) * 50).to(torch.float8_e4m3fn)
    w[0, 0] = float("nan")  # left out: the plain scan reports it
    got = fp8_block_mags("F8_E4M3", w.view(torch.uint8), 2, 4)
    v = w.float().nan_to_num(0).abs()
    want = torch.nn.functional.pad(v, (0, 1, 0, 1)).reshape(3, 2, 2, 4).amax(dim=(1, 3))
    assert torch.equal(got, want)


def test_fp4_pairs():
    # bytes: low nibble first; 0x7 is 6, 0xF is -6, 0x1 is 0.5
    m = torch.tensor([[0x71, 0x00], [0x1F, 0x11]], dtype=torch.uint8)
    assert fp4_pair_mags(m, 2).tolist() == [[6.0, 0.0], [6.0, 0.5]]
    assert fp4_pair_mags(m, 4).tolist() == [[6.0], [6.0]]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_unpack_bits_is_a_little_endian_stream(bits):
    torch.manual_seed(bits)
    n = 32 * 3 // bits if bits == 3 else 32 * 2 // bits
    codes = torch.randint(0, 1 << bits, (2, n))
    words = []
    for row in codes.tolist():
        stream = sum(c << (i * bits) for i, c in enumerate(row))
        nwords = -(-n * bits // 32)
        words.append([((stream >> (32 * k)) & 0xFFFFFFFF) - ((stream >> (32 * k) & 0x80000000) << 1)
                      for k in range(nwords)])
    got = unpack_bits(torch.tensor(words, dtype=torch.int32), bits)
    assert torch.equal(got[:, :n], codes.to(torch.int32))


def test_decoders():
    raw16 = torch.tensor([1.5, -2.0], dtype=torch.float16).view(torch.uint8).reshape(2, 2)
    assert decode_f16(raw16).tolist() == [1.5, -2.0]
    raw32 = torch.tensor([3.25], dtype=torch.float32).view(torch.uint8).reshape(1, 4)
    assert decode_f32(raw32).tolist() == [3.25]
    e = decode_e8m0(torch.tensor([[127], [130], [255]], dtype=torch.uint8))
    assert e[:2].reshape(-1).tolist() == [1.0, 8.0] and math.isnan(float(e.reshape(-1)[2]))
