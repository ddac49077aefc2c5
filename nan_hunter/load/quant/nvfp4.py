"""``nvfp4``: fp4 (E2M1) pairs with an fp8 scale per 16 values and a global scale.

``X.weight`` (modelopt) or ``X.weight_packed`` (compressed-tensors) uint8 ``[out, in/2]``,
``X.weight_scale`` fp8 ``[out, in/16]``; modelopt's ``X.weight_scale_2`` multiplies, compressed-tensors'
``X.weight_global_scale`` divides: ``fp4 * scale * global``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import grid
from .base import SCALE_TAGS, Blocks, Context, QuantizedWeight, block_of, rows_cols, scale_values
from .mxfp4 import Fp4Layout, fp4_window
from .pairs import weight_scale_pairs

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    import numpy as np

    from ..checkpoint import Checkpoint


class Nvfp4:
    name = "nvfp4"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        found = []
        for p in weight_scale_pairs(ctx):
            if ctx.tag(p.data) != "U8" or p.kind == "scale":
                continue
            g2 = next(
                (n for n in (p.prefix + "_scale_2", p.prefix + "_global_scale") if n in ctx.names), None
            )
            if g2 is None and ctx.tag(p.scale) != "F8_E4M3":
                continue
            ds, ss = ctx.shape(p.data), ctx.shape(p.scale)
            if not math.prod(ds) or not math.prod(ss):
                ctx.claim(p.data, p.scale)
                continue
            if g2 is not None and (ctx.tag(g2) not in SCALE_TAGS or not math.prod(ctx.shape(g2))):
                g2 = None
            rows, cols = rows_cols(ds)
            srows, scols = rows_cols(ss)
            bc = block_of(cols * 2, scols, 16)
            if srows != rows or not bc or bc % 2:
                ctx.skip(
                    p.data,
                    "U8",
                    f"scale {p.scale} {ss} does not match its data {ds} in any known quantized format",
                    p.scale,
                )
                continue
            g = grid.Grid(1, rows, cols, 1, cols, bc // 2)
            lay = Fp4Layout(g, tuple(ss), g2, g2 is not None and g2.endswith("_global_scale"))
            found.append(QuantizedWeight(p.data, "nvfp4", p.scale, self, lay))
            ctx.claim(p.data, p.scale, g2)
        return found

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        lay: Fp4Layout = q.layout
        g = lay.grid
        gscale = 1.0
        extra: list[dict[str, Any]] = []
        if lay.global_scale is not None:
            v = float(scale_values(ck, lay.global_scale)[0])
            gscale = (1.0 / v) if lay.global_divides and v != 0 else (math.inf if lay.global_divides else v)
            if not math.isfinite(gscale) or gscale == 0:
                problem = "nan" if gscale != gscale else ("inf" if gscale else "zero")
                extra.append(
                    {
                        "index": [],
                        "scale": "nan" if gscale != gscale else ("inf" if gscale else 0.0),
                        "problem": problem,
                    }
                )
        return Blocks(
            scale_values(ck, q.scale),
            list(lay.scale_shape),
            6.0,
            g.stripe_of(),
            g.n_stripes,
            g.row_bytes,
            multiplier=gscale,
            sizes=g.sizes(2),
            extra_bad=extra,
            extra_faults=len(extra),
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        return fp4_window(ck, q, first, count)
