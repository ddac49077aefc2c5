"""``awq``: AWQ weights as AutoAWQ writes them (read from ``awq/modules/linear/gemm.py`` and
``gemv.py``, ``WQLinear_*.from_linear``, and ``awq/utils/packing_utils.py``).

- GEMM (``version: "gemm"``, the default): ``X.qweight`` int32 ``[in, out * bits / 32]`` packed along
  the output dim in AWQ's order (word ``c`` holds outputs ``c*8 + [0, 2, 4, 6, 1, 3, 5, 7]`` at shifts
  ``0, 4, ..., 28``), ``X.qzeros`` int32 ``[in / g, out * bits / 32]`` packed the same way, ``X.scales``
  fp16 ``[in / g, out]``.
- GEMV (``version: "gemv"``): ``X.qweight`` int32 ``[out, in / 8]`` packed along the input dim in
  natural order, ``X.qzeros`` int32 ``[out, width]`` and ``X.scales`` fp16 ``[out, width * 8]``, the
  groups padded to ``width`` (``calculate_zeros_width``) with zero scales.

Zero points are stored as they are (``w = (q - z) * s``); AWQ is asymmetric.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import safetensors_file as sf
from .base import Blocks, Context, QuantizedWeight, scale_values
from .gptq import group_names

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # packed slot k holds output column AWQ_ORDER[k] of the 8
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output column p sits in packed slot AWQ_REVERSE_ORDER[p]


@dataclass(frozen=True)
class AwqLayout:
    gemv: bool
    n_in: int
    n_out: int
    groups: int  # groups holding inputs (GEMV's scales carry padding groups after them)
    group_size: int
    qzeros: str
    scale_shape: tuple[int, ...]


def unpack_nibbles(words: np.ndarray) -> np.ndarray:
    """int32 ``[r, w]`` → 4-bit codes ``[r, w, 8]`` in packed-slot order (slot k at shift 4k)."""
    shifts = np.arange(0, 32, 4, dtype=np.int32)
    return (words.astype(np.int32, copy=False)[..., None] >> shifts) & 15


def awq_columns(words: np.ndarray) -> np.ndarray:
    """GEMM words ``[r, w]`` → codes ``[r, w * 8]`` in output-column order."""
    c = unpack_nibbles(words)
    return c[:, :, list(AWQ_REVERSE_ORDER)].reshape(words.shape[0], -1)


class Awq:
    name = "awq"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        method = str(ctx.qc.get("quant_method", "")).lower()
        if method not in ("awq", ""):
            return []
        version = str(ctx.qc.get("version", "gemm")).lower()
        bits = ctx.qc.get("bits", ctx.qc.get("w_bit", 4))
        gs_cfg = ctx.qc.get("group_size", ctx.qc.get("q_group_size"))
        found = []
        for x in group_names(ctx, "awq"):
            qw, qz, sc = x + ".qweight", x + ".qzeros", x + ".scales"
            qs, zs, ss = ctx.shape(qw), ctx.shape(qz), ctx.shape(sc)
            tags = ctx.tag(qw), ctx.tag(qz), ctx.tag(sc)
            if len(qs) != 2 or len(zs) != 2 or len(ss) != 2:
                continue
            why = None
            gemv = version == "gemv"
            if version not in ("gemm", "gemv"):
                why = f"AWQ version {version!r} packs differently (gemm and gemv are read)"
            elif bits != 4:
                why = f"{bits}-bit AWQ (AutoAWQ writes 4-bit only)"
            elif tags[0] != "I32" or tags[1] != "I32" or tags[2] not in ("F16", "BF16", "F32"):
                why = f"AWQ tensors stored as {tags} (int32 words and float scales are read)"
            if why:
                ctx.skip(qw, tags[0], why, qz, sc)
                continue
            if gemv:
                n_out, n_in = qs[0], qs[1] * 8
                gs = gs_cfg if type(gs_cfg) is int and gs_cfg > 0 else 0
                groups = n_in // gs if gs and n_in % gs == 0 else 0
                ok = bool(
                    ss[0] == n_out and zs[0] == n_out and groups and ss[1] >= groups and zs[1] * 8 >= groups
                )
            else:
                n_in, n_out = qs[0], qs[1] * 8
                groups = ss[0]
                gs = n_in // groups if groups and n_in % groups == 0 else 0
                ok = bool(ss[1] == n_out and zs == [groups, qs[1]] and gs)
            if not ok:
                ctx.skip(
                    qw,
                    "I32",
                    f"AWQ {version} qweight {qs}, qzeros {zs}, scales {ss} do not fit one layout",
                    qz,
                    sc,
                )
                continue
            lay = AwqLayout(gemv, n_in, n_out, groups, gs, qz, tuple(ss))
            found.append(QuantizedWeight(qw, "awq", sc, self, lay))
            ctx.claim(qw, qz, sc)
        return found

    def _zeros(self, ck: Checkpoint, lay: AwqLayout) -> np.ndarray:
        """Zero codes in the scales' own layout: GEMM ``[groups, out]``, GEMV ``[out, groups]``."""
        qz = ck.array(lay.qzeros).astype(np.int32)
        if lay.gemv:
            return unpack_nibbles(qz).reshape(qz.shape[0], -1)[:, : lay.groups]
        return awq_columns(qz)[:, : lay.n_out]

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        lay: AwqLayout = q.layout
        z = q.cache["zero"] = self._zeros(ck, lay)
        bound = np.maximum(z, 15 - z).astype(np.float32)
        scales = scale_values(ck, q.scale).reshape(lay.scale_shape)
        known: np.ndarray | None = None
        if lay.gemv:  # groups past the input's end are padding: no data (magnitude 0)
            width = scales.shape[1]
            b = np.full((lay.n_out, width), 15.0, dtype=np.float32)
            b[:, : lay.groups] = bound
            bound = b
            known = np.full((lay.n_out, width), -1.0, dtype=np.float32)
            known[:, lay.groups :] = 0.0
            known = known.reshape(-1)
            stripe_of = np.zeros(lay.n_out * width, dtype=np.int64)  # one stripe: rows are outputs
            n_stripes, per = 1, lay.n_out * lay.n_in * 8
        else:
            stripe_of = np.arange(lay.groups * lay.n_out, dtype=np.int64) // lay.n_out
            n_stripes, per = lay.groups, lay.group_size * lay.n_out * 4 * 2
        per_group = np.maximum(
            0,
            np.minimum(
                lay.group_size,
                lay.n_in
                - np.arange(scales.shape[1] if lay.gemv else scales.shape[0], dtype=np.int64)
                * lay.group_size,
            ),
        )
        sizes = np.tile(per_group, lay.n_out) if lay.gemv else np.repeat(per_group, lay.n_out)
        return Blocks(
            scales.reshape(-1),
            list(lay.scale_shape),
            bound.reshape(-1),
            stripe_of,
            n_stripes,
            per,
            known=known,
            sizes=sizes,
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:

        lay: AwqLayout = q.layout
        z = q.cache["zero"]
        if lay.gemv:  # [out, in/8]: a chunk of output rows at a time, all groups of each
            row_bytes = lay.n_in // 2
            step = max(1, sf.PIECE // 64 // row_bytes)
            width = lay.scale_shape[1]
            for o0 in range(0, lay.n_out, step):
                o1 = min(lay.n_out, o0 + step)
                w = ck.read_bytes(q.name, o0 * row_bytes, (o1 - o0) * row_bytes).view("<i4")
                c = unpack_nibbles(w.reshape(o1 - o0, -1)).reshape(o1 - o0, lay.groups, lay.group_size)
                zz = z[o0:o1][..., None]
                m = np.maximum(c.max(-1, keepdims=True) - zz, zz - c.min(-1, keepdims=True)).squeeze(-1)
                idx = (np.arange(o0, o1, dtype=np.int64)[:, None] * width + np.arange(lay.groups)).reshape(-1)
                yield idx, np.maximum(m, 0).astype(np.float32).reshape(-1)
            return
        row_bytes = lay.n_out // 2
        g1 = min(lay.groups, first + count)
        w = ck.read_bytes(
            q.name, first * lay.group_size * row_bytes, (g1 - first) * lay.group_size * row_bytes
        )
        c = awq_columns(w.view("<i4").reshape(-1, lay.n_out // 8)).reshape(
            g1 - first, lay.group_size, lay.n_out
        )
        zz = z[first:g1]
        m = np.maximum(np.maximum(c.max(1) - zz, zz - c.min(1)), 0).astype(np.float32)
        yield np.arange(first * lay.n_out, g1 * lay.n_out, dtype=np.int64), m.reshape(-1)
