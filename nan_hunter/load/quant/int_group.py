"""``int_group``: compressed-tensors integer weights.

``pack-quantized``: ``X.weight_packed`` int32 (``num_bits``-bit values densely packed, little-endian,
stored as ``q + 2**(bits-1)``), ``X.weight_scale`` ``[out, in/group]``, optional ``X.weight_zero_point``
(packed along dim 0 the same way), ``X.weight_shape``; ``int-quantized``: ``X.weight`` int8 with
``X.weight_scale``. Dequantized as ``(q - zero_point) * scale``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import grid
from .base import SCALE_TAGS, Blocks, Context, QuantizedWeight, block_of, rows_cols, scale_values
from .codes import unpack_bits
from .pairs import weight_scale_pairs

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint


@dataclass(frozen=True)
class IntLayout:
    grid: grid.Grid  # units: codes
    scale_shape: tuple[int, ...]
    bits: int
    packed: bool  # int32 words (else int8 values)
    zero_point: str | None


def _int_params(qc: dict[str, Any]) -> tuple[int | None, int | None]:
    """(num_bits, group_size) of compressed-tensors' weight scheme, when the config gives them."""
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        for g in groups.values():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict):
                bits, gs = w.get("num_bits"), w.get("group_size")
                return (bits if type(bits) is int else None), (gs if type(gs) is int else None)
    return None, None


class IntGroup:
    name = "int_group"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        bits_cfg, group_cfg = _int_params(ctx.qc)
        found = []
        for p in weight_scale_pairs(ctx):
            dt, st = ctx.tag(p.data), ctx.tag(p.scale)
            if st not in SCALE_TAGS or not ((dt == "I32" and p.data.endswith("_packed")) or dt == "I8"):
                continue
            ds, ss = ctx.shape(p.data), ctx.shape(p.scale)
            if not math.prod(ds) or not math.prod(ss):
                ctx.claim(p.data, p.scale)
                continue
            rows, cols = rows_cols(ds)
            srows, scols = rows_cols(ss)
            n_scales = math.prod(ss)
            zp: str | None = p.prefix + "_zero_point" if p.prefix + "_zero_point" in ctx.names else None
            lay = None
            if dt == "I32":
                shp = p.prefix + "_shape"
                true_cols = None
                if shp in ctx.names and ctx.tag(shp) in (
                    "I64",
                    "I32",
                    "U64",
                    "U32",
                    "I16",
                    "U16",
                    "I8",
                    "U8",
                ):
                    v = ctx.ck.array(shp).reshape(-1).tolist()
                    true_cols = int(v[-1]) if v and 0 < int(v[-1]) <= cols * 32 else None
                bits = bits_cfg or (round(cols * 32 / true_cols) if true_cols else 4)
                n_codes = true_cols or cols * 32 // max(1, bits)
                if srows == rows and 1 <= bits <= 8 and not (zp and ctx.tag(zp) not in ("I32", "I8")):
                    bc = (
                        group_cfg
                        if group_cfg and -(-n_codes // group_cfg) == scols
                        else block_of(n_codes, scols, None)
                    )
                    if bc:
                        lay = IntLayout(
                            grid.Grid(1, rows, cols * 4, 1, n_codes, bc), tuple(ss), bits, True, zp
                        )
            elif n_scales == 1:
                lay = IntLayout(grid.Grid(1, rows, cols, rows, cols, cols), tuple(ss), 8, False, None)
            elif srows == rows:
                bc = block_of(cols, scols, group_cfg)
                if bc:
                    lay = IntLayout(grid.Grid(1, rows, cols, 1, cols, bc), tuple(ss), 8, False, None)
            if lay is None:
                ctx.skip(
                    p.data,
                    dt,
                    f"scale {p.scale} {ss} does not match its data {ds} in any known quantized format",
                    p.scale,
                    zp,
                )
                continue
            found.append(QuantizedWeight(p.data, "int_group", p.scale, self, lay))
            ctx.claim(p.data, p.scale, zp, p.prefix + "_shape")
        return found

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        lay: IntLayout = q.layout
        g = lay.grid
        grow = 2 * (
            32 // lay.bits if lay.packed else 4
        )  # int32 codes (and their temporaries) per stored byte
        return Blocks(
            scale_values(ck, q.scale),
            list(lay.scale_shape),
            float(1 << lay.bits),
            g.stripe_of(),
            g.n_stripes,
            g.br * g.row_bytes * grow,
            sizes=g.sizes(),
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        lay: IntLayout = q.layout
        g = lay.grid
        zp = None
        if lay.zero_point is not None:
            zt = ck.array(lay.zero_point)
            if zt.dtype == np.int32:  # packed along dim 0, offset like the values
                zp = unpack_bits(np.ascontiguousarray(_t(zt)), lay.bits)[:, : g.rows].T - (
                    1 << (lay.bits - 1)
                )
            else:
                zp = zt.astype(np.int32)
            zp = zp.reshape(g.rows, -1)[:, : g.nbc]

        def codes(m: np.ndarray, row0: int) -> np.ndarray:
            if not lay.packed:
                mags: np.ndarray = np.abs(m.view(np.int8).astype(np.int32))
                return mags
            v = unpack_bits(m.view(np.int32), lay.bits)[:, : g.units] - (1 << (lay.bits - 1))
            if zp is not None:
                n = m.shape[0]
                v = v - np.repeat(zp[row0 : row0 + n], g.bu, axis=1)[:, : g.units]
            centred: np.ndarray = np.abs(v)
            return centred

        return grid.window(ck, q.name, g, first, count, codes, lambda red: red.astype(np.float32))


def _t(a: np.ndarray) -> np.ndarray:
    """A matrix transposed (a vector as it is); more dims do not fit a packed zero point."""
    if a.ndim > 2:
        raise ValueError(f"a packed zero point has {a.ndim} dims, not 2")
    return a.T if a.ndim == 2 else a
