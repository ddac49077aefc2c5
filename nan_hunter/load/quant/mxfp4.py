"""``mxfp4``: 32 fp4 (E2M1) values per block with one E8M0 exponent: ``fp4 * 2**(s - 127)``, 0xFF is NaN.

- gpt-oss: ``X_blocks`` uint8 ``[..., G, 16]`` (two values per byte, low nibble first) and
  ``X_scales`` uint8 ``[..., G]``;
- compressed-tensors / Quark: ``X.weight_packed`` (or ``X.weight``) uint8 ``[out, in/2]`` with
  ``X.weight_scale`` uint8/E8M0 ``[out, in/32]`` and no global scale;
- DeepSeek-V4: ``X.weight`` fp4 (``F4``, or bytes) with ``X.scale`` E8M0 ``[out, in/32]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import grid
from .base import Blocks, Context, QuantizedWeight, block_of, rows_cols, scale_values
from .codes import fp4_mag_table
from .pairs import weight_scale_pairs

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint


@dataclass(frozen=True)
class Fp4Layout:
    grid: grid.Grid  # units: bytes (two values each)
    scale_shape: tuple[int, ...]
    global_scale: str | None = None
    global_divides: bool = False


def fp4_codes(m: np.ndarray, _row0: int) -> np.ndarray:
    """Per byte, the larger magnitude code of its two fp4 values."""
    larger: np.ndarray = np.maximum(m & 0x7, (m >> 4) & 0x7)
    return larger


def fp4_window(
    ck: Checkpoint, q: QuantizedWeight, first: int, count: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    table = fp4_mag_table()
    return grid.window(
        ck, q.name, q.layout.grid, first, count, fp4_codes, lambda red: table[red.astype(np.int64)]
    )


class Mxfp4:
    name = "mxfp4"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        found = []
        for s in sorted(n for n in ctx.names if n.endswith("_scales") and ctx.free(n)):
            data = s[: -len("_scales")] + "_blocks"
            if not ctx.free(data):
                continue
            ds, ss = ctx.shape(data), ctx.shape(s)
            if (
                len(ds) >= 2
                and ds[:-1] == ss
                and ds[-1] == 16
                and ctx.tag(data) == "U8"
                and ctx.tag(s) in ("U8", "F8_E8M0")
                and math.prod(ds) != 0
            ):
                g = grid.Grid(1, rows_cols(ss)[0], ss[-1] * 16, 1, ss[-1] * 16, 16)
                found.append(QuantizedWeight(data, "mxfp4", s, self, Fp4Layout(g, tuple(ss))))
                ctx.claim(data, s)
            else:
                ctx.skip(data, ctx.tag(data), f"mxfp4 blocks {ds} do not match scales {ss}", s)
        for p in weight_scale_pairs(ctx):
            dt, st = ctx.tag(p.data), ctx.tag(p.scale)
            e8m0 = st == "F8_E8M0" or (st == "U8" and p.kind != "scale_inv")
            if not (e8m0 and (dt == "F4" or dt in ("U8", "I8"))) or ctx.free(p.prefix + "_global_scale"):
                continue
            ds, ss = ctx.shape(p.data), ctx.shape(p.scale)
            if not math.prod(ds) or not math.prod(ss):
                ctx.claim(p.data, p.scale)
                continue
            rows, cols = rows_cols(ds)
            nbytes = ctx.ck.nbytes_of(p.data)
            row_bytes = nbytes // max(1, rows)
            srows, scols = rows_cols(ss)
            if srows == rows and row_bytes * rows == nbytes and block_of(row_bytes * 2, scols, 32) == 32:
                g = grid.Grid(1, rows, row_bytes, 1, row_bytes, 16)
                found.append(QuantizedWeight(p.data, "mxfp4", p.scale, self, Fp4Layout(g, tuple(ss))))
                ctx.claim(p.data, p.scale)
            else:
                ctx.skip(
                    p.data,
                    dt,
                    f"scale {p.scale} {ss} does not match its data {ds} in any known quantized format",
                    p.scale,
                )
        return found

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        g = q.layout.grid
        return Blocks(
            scale_values(ck, q.scale, e8m0=True),
            list(q.layout.scale_shape),
            6.0,
            g.stripe_of(),
            g.n_stripes,
            g.row_bytes,
            sizes=g.sizes(2),
        )  # two fp4 values a byte

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        return fp4_window(ck, q, first, count)
