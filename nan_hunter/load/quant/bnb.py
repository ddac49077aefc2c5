"""bitsandbytes weights as ``Linear4bit`` / ``Linear8bitLt`` save them (read from bitsandbytes'
``QuantState.as_dict(packed=True)`` / ``from_dict``, ``dequantize_4bit``, ``dequantize_blockwise``).

- ``bnb_nf4`` / ``bnb_fp4``: ``X.weight`` uint8 (two 4-bit codes per byte, the first in the high
  nibble), ``X.weight.absmax`` (float32 per block of ``blocksize`` values; with nested quantization
  uint8 codes into ``X.weight.nested_quant_map`` times ``X.weight.nested_absmax`` per 256 blocks,
  plus ``nested_offset``), ``X.weight.quant_map`` (16 values), and
  ``X.weight.quant_state.bitsandbytes__nf4|fp4``: a uint8 tensor holding JSON (``quant_type``,
  ``blocksize``, ``dtype``, ``shape``, and the ``nested_*`` fields). Dequantized as
  ``quant_map[code] * absmax[block]``. A block holds data when some code's value is not 0.
- ``bnb_int8`` (LLM.int8): ``X.weight`` int8 ``[out, in]`` with ``X.SCB`` float32 ``[out]`` (and
  ``X.weight_format``): ``w = q * SCB / 127``; a row holds data when some code is not 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import BadInput
from .. import bounded_json
from .base import FLOAT_TAGS, Blocks, Context, QuantizedWeight, scale_values
from .grid import Grid, window

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

MAX_QUANT_STATE = 64 << 10  # bytes of quant_state JSON (bitsandbytes writes about 150)
STATE_KEYS = {
    "quant_type",
    "blocksize",
    "dtype",
    "shape",
    "nested_blocksize",
    "nested_dtype",
    "nested_offset",
}
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Bnb4Layout:
    quant_type: str
    blocksize: int
    n_values: int
    absmax: str
    quant_map: str
    nested: tuple[str, str, float, int] | None  # (nested_absmax, nested_quant_map, offset, nested_blocksize)


def quant_state(ck: Checkpoint, name: str) -> dict[str, Any]:
    """The JSON of a ``quant_state.bitsandbytes__*`` tensor, parsed with the bounds of any header:
    size, nesting depth, no NaN, no duplicate key, known keys and types only; exit 2 otherwise."""

    e = ck.entry(name)
    nbytes = e.nbytes if e is not None else ck.nbytes_of(name)
    where = f"{ck.path}: quant_state {name!r}"
    if nbytes > MAX_QUANT_STATE:
        raise BadInput(
            f"{where} is {nbytes} bytes, over the {MAX_QUANT_STATE}-byte limit; re-save the checkpoint"
        )
    raw = ck.read_bytes(name, 0, nbytes).tobytes()
    data = bounded_json.loads(raw, where, max_depth=4, unique_keys=True)
    if not isinstance(data, dict) or not set(data) <= STATE_KEYS:
        extra = sorted(set(data) - STATE_KEYS)[:3] if isinstance(data, dict) else None
        raise BadInput(
            f"{where}: not a bitsandbytes quant state ({'unknown keys ' + repr(extra) if extra else 'not a JSON object'})"
        )
    bs = data.get("blocksize")
    shape = data.get("shape")
    if data.get("quant_type") not in ("nf4", "fp4") or type(bs) is not int or bs not in BLOCKSIZES:
        raise BadInput(
            f"{where}: quant_type {data.get('quant_type')!r} / blocksize {bs!r} are not bitsandbytes' "
            "(nf4 or fp4; a power of two from 32 to 4096)"
        )
    if not (
        isinstance(shape, list)
        and 0 < len(shape) <= 8
        and all(type(d) is int and 0 <= d < 2**40 for d in shape)
    ):
        raise BadInput(f"{where}: shape {str(shape)[:60]} is not a list of sizes")
    if "nested_blocksize" in data or "nested_offset" in data:
        nb, off = data.get("nested_blocksize"), data.get("nested_offset")
        if type(nb) is not int or nb not in BLOCKSIZES or type(off) not in (int, float):
            raise BadInput(f"{where}: nested_blocksize {nb!r} / nested_offset {off!r} are not bitsandbytes'")
    return data


class Bnb4bit:
    name = "bnb4"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        found = []
        for st in sorted(n for n in ctx.names if ".weight.quant_state.bitsandbytes__" in n and ctx.free(n)):
            w = st[: st.index(".weight.quant_state.") + len(".weight")]
            parts = {k: f"{w}.{k}" for k in ("absmax", "quant_map", "nested_absmax", "nested_quant_map")}
            if not ctx.free(w) or not ctx.free(parts["absmax"]) or not ctx.free(parts["quant_map"]):
                continue
            state = quant_state(ctx.ck, st)
            qt = state["quant_type"]
            nested = None
            if "nested_offset" in state:
                if not (ctx.free(parts["nested_absmax"]) and ctx.free(parts["nested_quant_map"])):
                    ctx.skip(
                        w,
                        ctx.tag(w),
                        "nested quantization without nested_absmax/nested_quant_map",
                        *parts.values(),
                        st,
                    )
                    continue
                nested = (
                    parts["nested_absmax"],
                    parts["nested_quant_map"],
                    float(state["nested_offset"]),
                    state["nested_blocksize"],
                )
            n = math.prod(state["shape"])
            bs = state["blocksize"]
            n_blocks = -(-n // bs)
            absmax_tag = ctx.tag(parts["absmax"])
            ok = (
                ctx.tag(w) == "U8"
                and ctx.ck.nbytes_of(w) == -(-n // 2)
                and math.prod(ctx.shape(parts["absmax"])) == n_blocks
                and math.prod(ctx.shape(parts["quant_map"])) == 16
                and ctx.tag(parts["quant_map"]) in FLOAT_TAGS
                and (absmax_tag == "U8" if nested else absmax_tag in FLOAT_TAGS)
            )
            if nested and ok:
                ok = (
                    ctx.tag(nested[0]) in FLOAT_TAGS
                    and ctx.tag(nested[1]) in FLOAT_TAGS
                    and math.prod(ctx.shape(nested[0])) == -(-n_blocks // nested[3])
                    and math.prod(ctx.shape(nested[1])) == 256
                )
            if not ok:
                ctx.skip(
                    w,
                    ctx.tag(w),
                    f"bitsandbytes {qt} tensors do not match the quant state (shape "
                    f"{state['shape']}, blocksize {bs})",
                    *parts.values(),
                    st,
                )
                continue
            lay = Bnb4Layout(qt, bs, n, parts["absmax"], parts["quant_map"], nested)
            found.append(QuantizedWeight(w, f"bnb_{qt}", parts["absmax"], self, lay))
            ctx.claim(w, st, *parts.values())
        return found

    def _absmax(self, ck: Checkpoint, lay: Bnb4Layout) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """The blocks' absmax as bitsandbytes computes it (nested: ``nested_quant_map[code] *
        nested_absmax[k // nested_blocksize] + offset``), and bad entries of the nested absmax."""
        if lay.nested is None:
            return scale_values(ck, lay.absmax), []
        na, nq, off, nbs = lay.nested
        codes = ck.array(lay.absmax).reshape(-1).astype(np.int64)
        nabs = scale_values(ck, na)
        qmap = scale_values(ck, nq)
        per = np.repeat(nabs, nbs)[: codes.size]
        values = qmap[codes] * per + np.float32(off)
        extra = []
        for i in np.flatnonzero(~np.isfinite(nabs) | (nabs <= 0))[:10].tolist():
            v = float(nabs[i])
            problem = "nan" if v != v else "inf" if math.isinf(v) else "zero" if v == 0 else "negative"
            extra.append(
                {
                    "index": [i],
                    "scale": "nan" if v != v else ("inf" if math.isinf(v) else v),
                    "problem": problem,
                    "tensor": na,
                }
            )
        return values, extra

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        lay: Bnb4Layout = q.layout
        values, extra = self._absmax(ck, lay)
        qmap = scale_values(ck, lay.quant_map)
        bound = float(np.nan_to_num(np.abs(qmap), nan=0.0).max())
        if not bool(np.isfinite(qmap).all()):
            extra.append({"index": [], "scale": "nan", "problem": "nan", "tensor": lay.quant_map})
        faults = sum(1 for e in extra if e["problem"] != "negative")
        g = self._grid(lay)
        stripe_of = g.stripe_of()[: -(-lay.n_values // lay.blocksize)]  # the last row of blocks may be short
        # a window's bytes become int64 indices and float32 magnitudes: budget 12 bytes per stored byte
        sizes = np.full(values.size, lay.blocksize, dtype=np.int64)
        if sizes.size:
            sizes[-1] = lay.n_values - (sizes.size - 1) * lay.blocksize
        return Blocks(
            values,
            [values.size],
            bound,
            stripe_of,
            g.n_stripes,
            g.row_bytes * 12,
            extra_bad=extra,
            extra_faults=faults,
            sizes=sizes,
        )

    @staticmethod
    def _grid(lay: Bnb4Layout) -> Grid:
        """One row per 64 blocks (a stripe): blocks of ``blocksize`` values, ``blocksize / 2`` bytes."""
        per_row = 64
        n_blocks = -(-lay.n_values // lay.blocksize)
        rows = -(-n_blocks // per_row)
        return Grid(
            1, rows, per_row * lay.blocksize // 2, 1, per_row * lay.blocksize // 2, lay.blocksize // 2
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        lay: Bnb4Layout = q.layout
        qmap = np.nan_to_num(np.abs(scale_values(ck, lay.quant_map)), nan=0.0)
        g = self._grid(lay)
        nbytes = -(-lay.n_values // 2)
        # magnitudes are |quant_map| of the codes; a byte's two codes reduce to the larger one
        pair = np.maximum(np.repeat(qmap, 16), np.tile(qmap, 16))  # byte b: max(|map[b >> 4]|, |map[b & 15]|)

        def codes(m: np.ndarray, _row0: int) -> np.ndarray:
            mags: np.ndarray = pair[m.astype(np.int64)]
            return mags

        for idx, vals in window(_Tail(ck, nbytes), q.name, g, first, count, codes, lambda red: red):
            keep = idx < -(-lay.n_values // lay.blocksize)
            yield idx[keep], vals[keep]


class _Tail:
    """A checkpoint view whose tensor reads past ``nbytes`` come back as zero bytes (the last stripe of
    a 4-bit weight is shorter than a whole row of blocks)."""

    def __init__(self, ck: Checkpoint, nbytes: int) -> None:
        self.ck, self.nbytes = ck, nbytes

    def read_bytes(self, name: str, offset: int, n: int) -> np.ndarray:
        got = self.ck.read_bytes(name, offset, max(0, min(n, self.nbytes - offset)))
        if got.size < n:
            got = np.concatenate([got, np.zeros(n - got.size, dtype=np.uint8)])
        return got


class Bnb8bit:
    name = "bnb8"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        found = []
        for scb in sorted(n for n in ctx.names if n.endswith(".SCB") and ctx.free(n)):
            x = scb[: -len(".SCB")]
            w = x + ".weight"
            if not ctx.free(w) or ctx.tag(w) != "I8":
                continue
            fmt = x + ".weight_format"
            ws, ss = ctx.shape(w), ctx.shape(scb)
            if len(ws) != 2 or math.prod(ss) != ws[0] or ctx.tag(scb) not in FLOAT_TAGS:
                ctx.skip(w, "I8", f"SCB {scb} {ss} does not match the int8 weight {ws}", scb, fmt)
                continue
            if fmt in ctx.names and not _row_format(ctx, fmt):
                ctx.skip(
                    w,
                    "I8",
                    f"weight_format {fmt} is not 'row' (the only layout bitsandbytes saves)",
                    scb,
                    fmt,
                )
                continue
            g = Grid(1, ws[0], ws[1], 1, ws[1], ws[1])
            found.append(QuantizedWeight(w, "bnb_int8", scb, self, g))
            ctx.claim(w, scb, fmt if fmt in ctx.names else None)
        return found

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        g: Grid = q.layout
        scb = scale_values(ck, q.scale)
        # bitsandbytes dequantizes as code x SCB x (1/127) (``int8_vectorwise_dequant``), in float32: the
        # product is taken first, as the library takes it, so an SCB near float32's max overflows here too
        return Blocks(
            scb,
            [scb.size],
            128.0,
            g.stripe_of(),
            g.n_stripes,
            g.row_bytes,
            multiplier=1.0 / 127.0,
            sizes=g.sizes(),
        )

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        return window(
            ck,
            q.name,
            q.layout,
            first,
            count,
            lambda m, _r: np.abs(m.view(np.int8).astype(np.int16)),
            lambda red: red.astype(np.float32),
        )


def _row_format(ctx: Context, name: str) -> bool:
    """transformers saves ``weight_format`` as a tensor holding 0 ('row') or as nothing."""
    tag = ctx.tag(name)
    if tag in FLOAT_TAGS or tag.startswith("F"):  # a floating tensor (fp8 and fp4 too) is not the format
        return False
    t = ctx.ck.array(name).reshape(-1)
    return t.size == 1 and int(t[0]) == 0
