"""fp8 weights with scales: ``fp8_block``, ``fp8_channel``, ``fp8_tensor``.

- ``fp8_block``: transformers' finegrained fp8 / DeepSeek-V3: ``X.weight`` fp8 ``[out, in]`` and
  ``X.weight_scale_inv`` fp32 ``[ceil(out/b0), ceil(in/b1)]`` (``quantization_config.weight_block_size``,
  128x128), dequantized as ``w * scale_inv``; compressed-tensors' fp8 group scales (``X.weight_scale``
  ``[out, in/g]``); DeepSeek-V4's own checkpoints (``X.weight`` with ``X.scale``, fp32 or E8M0).
  MoE weights ``[E, out, in]`` with scales ``[E, ...]`` are blocked per expert; an expert whose rows
  are not whole blocks has a partial last block, checked on its own rows.
- ``fp8_channel`` / ``fp8_tensor``: ``X.weight`` fp8 with ``X.weight_scale`` ``[out, 1]`` / one value
  (compressed-tensors ``float-quantized``, modelopt FP8, Quark FP8): ``w * scale``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import grid
from .base import FP8_TAGS, SCALE_TAGS, Blocks, Context, QuantizedWeight, block_of, rows_cols, scale_values
from .codes import FP8_BAD_MAG, fp8_block_mags, fp8_mag_table
from .pairs import weight_scale_pairs

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint


@dataclass(frozen=True)
class Fp8Layout:
    grid: grid.Grid
    tag: str  # the data's fp8 tag
    scale_shape: tuple[int, ...]
    e8m0: bool  # scales stored as E8M0 exponent bytes


class Fp8:
    name = "fp8"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        wbs = ctx.qc.get("weight_block_size")
        given = (
            wbs
            if isinstance(wbs, list) and len(wbs) == 2 and all(type(x) is int and x > 0 for x in wbs)
            else None
        )
        found = []
        for p in weight_scale_pairs(ctx):
            dt, st = ctx.tag(p.data), ctx.tag(p.scale)
            if dt not in FP8_TAGS or st not in SCALE_TAGS or (st in FP8_TAGS and p.kind != "weight_scale"):
                continue
            ds, ss = ctx.shape(p.data), ctx.shape(p.scale)
            if not math.prod(ds) or not math.prod(ss):
                ctx.claim(p.data, p.scale)  # empty: nothing to dequantize
                continue
            q = _layout(
                p.data, p.scale, ds, ss, dt, st == "F8_E8M0" or (st == "U8" and p.kind == "scale"), given
            )
            if q is None:
                ctx.skip(
                    p.data,
                    dt,
                    f"scale {p.scale} {ss} does not match its data {ds} in any known quantized format",
                    p.scale,
                )
                continue
            fmt, layout = q
            found.append(QuantizedWeight(p.data, fmt, p.scale, self, layout))
            ctx.claim(p.data, p.scale)
        return found

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        lay: Fp8Layout = q.layout
        g = lay.grid
        values = scale_values(ck, q.scale, e8m0=lay.e8m0)
        return Blocks(
            values,
            list(lay.scale_shape),
            float(fp8_mag_table(lay.tag).max()),
            g.stripe_of(),
            g.n_stripes,
            g.br * g.row_bytes,
            sizes=g.sizes(),
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        lay: Fp8Layout = q.layout
        table = fp8_mag_table(lay.tag)

        def codes(m: np.ndarray, _row0: int) -> np.ndarray:
            return fp8_codes(lay.tag, m)

        return grid.window(ck, q.name, lay.grid, first, count, codes, lambda red: table[red.astype(np.int64)])


def fp8_codes(tag: str, m: np.ndarray) -> np.ndarray:
    """Magnitude codes of fp8 bytes, NaN/Inf codes as 0 (the plain scan reports them)."""

    mag = m & 0x7F
    if tag in ("F8_E4M3FNUZ", "F8_E5M2FNUZ"):
        return mag  # 0x80 (NaN) has magnitude code 0
    return np.where(mag >= FP8_BAD_MAG[tag], np.uint8(0), mag)


def _layout(
    data: str, scale: str, ds: list[int], ss: list[int], tag: str, e8m0: bool, given: list[int] | None
) -> tuple[str, Fp8Layout] | None:
    rows, cols = rows_cols(ds)
    srows, scols = rows_cols(ss)
    n_scales = math.prod(ss) if ss else 1
    if n_scales == 1:
        return "fp8_tensor", Fp8Layout(grid.Grid(1, rows, cols, rows, cols, cols), tag, tuple(ss), e8m0)
    if srows == rows and scols == 1:
        return "fp8_channel", Fp8Layout(grid.Grid(1, rows, cols, 1, cols, cols), tag, tuple(ss), e8m0)
    if len(ds) > 2 and len(ss) == len(ds) and ds[:-2] == ss[:-2]:  # MoE: blocks per expert
        lead, r, sr = math.prod(ds[:-2]), ds[-2], ss[-2]
    elif len(ds) <= 2:
        lead, r, sr = 1, rows, srows
    else:
        return None
    br = block_of(r, sr, given[0] if given else None)
    bc = block_of(cols, scols, given[1] if given else None)
    if not (br and bc):
        return None
    return "fp8_block", Fp8Layout(grid.Grid(lead, r, cols, br, cols, bc), tag, tuple(ss), e8m0)


__all__ = ["Fp8", "fp8_block_mags"]
