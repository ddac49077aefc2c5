"""load/quant/codes.py: codes from raw bytes — fp8/fp4 magnitudes (NaN/Inf codes as 0), block
maxima with zero padding, and little-endian packed integers of any width. (fp4 nibble pairs read per
block: test_mxfp4.py; fp16/fp32/E8M0 scales decoded: test_base.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nan_hunter.load.quant.codes import (
    fp4_mag_table,
    fp8_block_mags,
    fp8_mag_table,
    reduce_blocks,
    unpack_bits,
)


@pytest.mark.parametrize(
    "tag, dtype, top", [("F8_E4M3", torch.float8_e4m3fn, 448.0), ("F8_E5M2", torch.float8_e5m2, 57344.0)]
)
def test_fp8_magnitudes_match_torch(tag, dtype, top):
    table = fp8_mag_table(tag)
    assert isinstance(table, np.ndarray) and table.dtype == np.float32 and table.shape == (128,)
    codes = torch.arange(128, dtype=torch.uint8)
    want = codes.view(dtype).float().abs().numpy()  # torch's own fp8 arithmetic as the reference
    finite = np.isfinite(want)
    assert np.array_equal(table[finite], want[finite]) and (table[~finite] == 0).all()
    assert float(table.max()) == top


def test_fp4_magnitudes():
    assert fp4_mag_table().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_reduce_blocks_pads_with_zeros():
    m = np.array([[1, 9, 2], [3, 4, 5], [8, 0, 0]], dtype=np.int32)
    assert reduce_blocks(m, 2, 2).tolist() == [[9, 5], [8, 0]]
    assert np.array_equal(reduce_blocks(m, 1, 1), m)


def test_fp8_block_maxima_against_the_values():
    torch.manual_seed(0)
    w = (torch.randn(5, 7) * 50).to(torch.float8_e4m3fn)
    w[0, 0] = float("nan")  # left out: the plain scan reports it
    got = fp8_block_mags("F8_E4M3", w.view(torch.uint8).numpy(), 2, 4)
    v = w.float().nan_to_num(0).abs()
    want = torch.nn.functional.pad(v, (0, 1, 0, 1)).reshape(3, 2, 2, 4).amax(dim=(1, 3)).numpy()
    assert got.dtype == np.float32 and np.array_equal(got, want)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_unpack_bits_is_a_little_endian_stream(bits):
    rng = np.random.default_rng(bits)
    n = 32 * 3 // bits if bits == 3 else 32 * 2 // bits
    codes = rng.integers(0, 1 << bits, (2, n))
    words = []
    for row in codes.tolist():
        stream = sum(c << (i * bits) for i, c in enumerate(row))
        nwords = -(-n * bits // 32)
        words.append(
            [
                ((stream >> (32 * k)) & 0xFFFFFFFF) - ((stream >> (32 * k) & 0x80000000) << 1)
                for k in range(nwords)
            ]
        )
    got = unpack_bits(np.array(words, dtype=np.int32), bits)
    assert got.dtype == np.int32 and np.array_equal(got[:, :n], codes)
