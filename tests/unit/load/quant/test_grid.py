"""load/quant/grid.py: blocks tiling a row-major matrix, per expert — block and stripe counts, the
stripe of each block in the scales' storage order, and windows of stripes read from the file giving
each block's largest magnitude (the same whichever way the stripes are cut)."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.load.quant import grid
from nan_hunter.load.quant.codes import reduce_blocks

from .kit import checkpoint


@pytest.mark.parametrize("g, nbr, nbc, n_blocks, n_stripes", [
    (grid.Grid(1, 10, 8, 4, 8, 3), 3, 3, 9, 3),
    (grid.Grid(2, 10, 8, 4, 8, 8), 3, 1, 6, 6),  # two experts, a partial last block row each
    (grid.Grid(1, 1, 5, 1, 5, 5), 1, 1, 1, 1),
])
def test_counts(g, nbr, nbc, n_blocks, n_stripes):
    assert (g.nbr, g.nbc, g.n_blocks, g.n_stripes) == (nbr, nbc, n_blocks, n_stripes)
    assert g.stripe_of().tolist() == [i // nbc for i in range(n_blocks)]


@pytest.mark.parametrize("first, count", [(0, 6), (0, 1), (2, 3), (5, 1)])
def test_window_gives_each_blocks_largest_code(tmp_path, first, count):
    torch.manual_seed(0)
    m = torch.randint(0, 100, (2, 10, 8), dtype=torch.uint8)  # two experts of 10 rows, 8 bytes a row
    ck = checkpoint(tmp_path, {"w": m})
    g = grid.Grid(2, 10, 8, 4, 8, 3)
    want = torch.cat([reduce_blocks(m[e], 4, 3).reshape(-1) for e in range(2)]).float()  # never across experts
    got = torch.full((g.n_blocks,), -1.0)
    for idx, vals in grid.window(ck, "w", g, first, count, lambda raw, _r0: raw, lambda red: red.float()):
        got[idx] = vals
    lo, hi = first * g.nbc, (first + count) * g.nbc
    assert torch.equal(got[lo:hi], want[lo:hi]) and (got[:lo] == -1).all() and (got[hi:] == -1).all()


def test_a_stripe_larger_than_a_piece_is_read_in_chunks(tmp_path, monkeypatch):
    from nan_hunter.load import safetensors_file

    monkeypatch.setattr(safetensors_file, "PIECE", 16)  # a 4 x 8-byte stripe is 32 bytes: two chunks or more
    m = torch.arange(80, dtype=torch.uint8).reshape(10, 8)
    g = grid.Grid(1, 10, 8, 4, 8, 8)
    out = dict()
    for idx, vals in grid.window(checkpoint(tmp_path, {"w": m}), "w", g, 0, 3, lambda raw, _r0: raw,
                                 lambda red: red.float()):
        out.update(zip(idx.tolist(), vals.tolist()))
    assert out == {0: 31.0, 1: 63.0, 2: 79.0}
