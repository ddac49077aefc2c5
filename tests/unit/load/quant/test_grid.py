"""load/quant/grid.py: blocks tiling a row-major matrix, per expert — block and stripe counts, the
stripe of each block in the scales' storage order, and windows of stripes read from the file giving
each block's largest magnitude (the same whichever way the stripes are cut)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nan_hunter.load.quant import grid

from .kit import checkpoint


@pytest.mark.parametrize(
    "g, nbr, nbc, n_blocks, n_stripes",
    [
        (grid.Grid(1, 10, 8, 4, 8, 3), 3, 3, 9, 3),
        (grid.Grid(2, 10, 8, 4, 8, 8), 3, 1, 6, 6),  # two experts, a partial last block row each
        (grid.Grid(1, 1, 5, 1, 5, 5), 1, 1, 1, 1),
    ],
)
def test_counts(g, nbr, nbc, n_blocks, n_stripes):
    assert (g.nbr, g.nbc, g.n_blocks, g.n_stripes) == (nbr, nbc, n_blocks, n_stripes)
    assert g.stripe_of().tolist() == [i // nbc for i in range(n_blocks)]


@pytest.mark.parametrize("first, count", [(0, 6), (0, 1), (2, 3), (5, 1)])
def test_window_gives_each_blocks_largest_code(tmp_path, first, count):
    m = np.random.default_rng(0).integers(
        0, 100, (2, 10, 8), dtype=np.uint8
    )  # two experts of 10 rows, 8 bytes a row
    ck = checkpoint(tmp_path, {"w": torch.from_numpy(m)})
    g = grid.Grid(2, 10, 8, 4, 8, 3)
    # each block's max by hand, never across experts: rows 0-3, 4-7, 8-9 and bytes 0-2, 3-5, 6-7 of each
    want = np.array(
        [m[e, r : r + 4, c : c + 3].max() for e in range(2) for r in (0, 4, 8) for c in (0, 3, 6)],
        dtype=np.float32,
    )
    got = np.full(g.n_blocks, -1.0, dtype=np.float32)
    for idx, vals in grid.window(
        ck, "w", g, first, count, lambda raw, _r0: raw, lambda red: red.astype(np.float32)
    ):
        assert idx.dtype == np.int64
        got[idx] = vals
    lo, hi = first * g.nbc, (first + count) * g.nbc
    assert np.array_equal(got[lo:hi], want[lo:hi]) and (got[:lo] == -1).all() and (got[hi:] == -1).all()


def test_a_stripe_larger_than_a_piece_is_read_in_chunks(tmp_path, monkeypatch):
    from nan_hunter.load import safetensors_file

    monkeypatch.setattr(safetensors_file, "PIECE", 16)  # a 4 x 8-byte stripe is 32 bytes: two chunks or more
    m = torch.arange(80, dtype=torch.uint8).reshape(10, 8)
    g = grid.Grid(1, 10, 8, 4, 8, 8)
    ck = checkpoint(tmp_path, {"w": m})
    reads = []
    read_bytes = ck.read_bytes
    monkeypatch.setattr(ck, "read_bytes", lambda name, off, n: reads.append(n) or read_bytes(name, off, n))
    out = dict()
    for idx, vals in grid.window(ck, "w", g, 0, 3, lambda raw, _r0: raw, lambda red: red.astype(np.float32)):
        out.update(zip(idx.tolist(), vals.tolist()))
    assert out == {0: 31.0, 1: 63.0, 2: 79.0}
    assert sum(reads) == 80 and max(reads) <= 16  # every byte read once, never more than a piece at a time


def test_sizes_count_the_values_of_partial_blocks():
    from nan_hunter.load.quant.grid import Grid

    g = Grid(2, 5, 10, 2, 10, 4)  # 2 experts of 5 rows; blocks of 2 rows x 4 units: 3 block rows, 3 columns
    assert g.sizes().reshape(2, 3, 3).tolist() == [[[8, 8, 4], [8, 8, 4], [4, 4, 2]]] * 2
    assert int(g.sizes(2).sum()) == 2 * 5 * 10 * 2  # two values a unit (packed fp4)
