"""Weights whose blocks tile a row-major matrix: ``[lead..., rows, cols]`` data with one scale per
block of ``br`` rows x ``bc`` elements, per leading index (MoE experts): fp8 block/channel/tensor,
mxfp4, nvfp4 and compressed-tensors int groups.

A stripe is one row of blocks of one expert (``br`` rows, or fewer for the last block row of an
expert whose rows are not whole blocks: such a partial block is checked on the rows it has, never
mixed with the next expert's). Block ``(l, i, j)`` (expert, block row, block column) has the flat
index ``(l * nbr + i) * nbc + j``, the scale tensor's storage order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .. import safetensors_file as sf
from .codes import reduce_blocks


@dataclass(frozen=True)
class Grid:
    lead: int  # experts (product of the leading dims); 1 for a plain matrix
    rows: int  # rows per expert
    row_bytes: int  # bytes per row as stored
    br: int  # rows per block
    units: int  # reduction units per row (bytes, nibble pairs, codes: what ``codes`` returns per row)
    bu: int  # units per block along the row

    @property
    def nbr(self) -> int:
        return -(-self.rows // self.br)

    @property
    def nbc(self) -> int:
        return -(-self.units // self.bu)

    @property
    def n_blocks(self) -> int:
        return self.lead * self.nbr * self.nbc

    @property
    def n_stripes(self) -> int:
        return self.lead * self.nbr

    def stripe_of(self) -> np.ndarray:
        return np.arange(self.n_blocks, dtype=np.int64) // self.nbc

    def sizes(self, per_unit: int = 1) -> np.ndarray:
        """Values each block holds (int64 [n_blocks], storage order): ``br`` rows x ``bu`` units of
        ``per_unit`` values, fewer in the last block row of each expert and the last block column."""
        r = np.minimum(self.br, self.rows - np.arange(self.nbr, dtype=np.int64) * self.br)
        c = np.minimum(self.bu, self.units - np.arange(self.nbc, dtype=np.int64) * self.bu) * per_unit
        return np.tile(np.outer(r, c).reshape(-1), self.lead)


#: per-row magnitudes of raw rows: ``codes(m uint8 [n, row_bytes], first_row) -> [n, units]`` (any
#: integer or float dtype ordered like the magnitudes), and their values: ``value(reduced) -> float32``
Codes = Callable[[np.ndarray, int], np.ndarray]
Value = Callable[[np.ndarray], np.ndarray]


class ByteSource(Protocol):
    """What ``window`` reads from: a ``Checkpoint``, or a view of one (``bnb._Tail``)."""

    def read_bytes(self, name: str, offset: int, nbytes: int) -> np.ndarray: ...


def window(
    ck: ByteSource, name: str, g: Grid, first: int, count: int, codes: Codes, value: Value
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stripes ``first .. first + count`` of ``name``: each block's largest magnitude, read in pieces
    of about ``PIECE`` bytes (whole stripes; a stripe larger than that in row chunks)."""

    stripe_bytes = g.br * g.row_bytes
    per_read = max(1, sf.PIECE // max(1, stripe_bytes))
    s = first
    end = first + count
    while s < end:
        lead, i0 = divmod(s, g.nbr)
        i1 = min(g.nbr, i0 + per_read, i0 + (end - s))  # stay inside one expert
        r0 = lead * g.rows + i0 * g.br
        r1 = lead * g.rows + min(g.rows, i1 * g.br)
        if stripe_bytes <= sf.PIECE:
            m = ck.read_bytes(name, r0 * g.row_bytes, (r1 - r0) * g.row_bytes).reshape(r1 - r0, g.row_bytes)
            red = reduce_blocks(codes(m, r0), g.br, g.bu)
        else:  # one stripe bigger than a piece: its rows in chunks, maxima combined
            chunks: np.ndarray | None = None
            step = max(1, sf.PIECE // 8 // max(1, g.row_bytes))  # codes may be 4-8x the bytes: smaller reads
            for c0 in range(r0, r1, step):
                c1 = min(r1, c0 + step)
                m = ck.read_bytes(name, c0 * g.row_bytes, (c1 - c0) * g.row_bytes).reshape(
                    c1 - c0, g.row_bytes
                )
                part = reduce_blocks(codes(m, c0), c1 - c0, g.bu)
                chunks = part if chunks is None else np.maximum(chunks, part)
            assert chunks is not None  # r1 > r0: at least one chunk was read
            red = chunks
        vals = value(red)
        idx = np.arange(s * g.nbc, (s + (i1 - i0)) * g.nbc, dtype=np.int64)
        yield idx, vals.reshape(-1)
        s += i1 - i0
