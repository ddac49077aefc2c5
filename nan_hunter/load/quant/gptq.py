"""``gptq``: GPTQ weights as gptqmodel, AutoGPTQ and optimum write them (read from gptqmodel's
``BaseQuantLinear.pack_block`` / ``dequantize_weight`` and ``convert_gptq_v1_to_v2_format``).

``X.qweight`` int32 ``[in * bits / 32, out]``: codes packed along the input dim, a little-endian bit
stream per output column (2/4/8-bit: ``32 / bits`` codes per word; 3-bit: 32 codes in 3 words);
``X.qzeros`` int32 ``[groups, out * bits / 32]`` packed the same way along the output dim;
``X.scales`` fp16 ``[groups, out]``; optional ``X.g_idx`` int32 ``[in]`` (input -> group; act-order
checkpoints scatter a group's inputs). Dequantized as ``scales[g_idx[i], o] * (q[i, o] - z[g_idx[i], o])``.

Zero points: ``checkpoint_format`` ``gptq`` (v1, the default; AutoGPTQ) stores ``zero - 1``,
``gptq_v2`` stores ``zero``. With ``sym: true`` every zero is the midpoint ``2**(bits-1)``: v1 stores
``2**(bits-1) - 1``, v2 stores ``2**(bits-1)``. A checkpoint that stores one convention and declares
the other is loaded one step off in every group: ``bad_zero_point``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import safetensors_file as sf
from .base import Blocks, Context, QuantizedWeight, scale_values

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

CONVENTIONS = ("gptq", "gptq_v2")


@dataclass(frozen=True)
class GptqLayout:
    bits: int
    n_in: int
    n_out: int
    groups: int
    group_size: int | None  # None: act-order (g_idx scatters the groups)
    qzeros: str
    g_idx: str | None
    convention: str  # gptq | gptq_v2 (declared)
    sym: bool | None
    groups_per_stripe: int


def gptq_codes(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 ``[rows, cols]`` packed along dim 0 (GPTQ's qweight) → codes ``[rows * 32 / bits, cols]``
    (int32). Rows of 3-bit words come in triples (32 codes in 96 bits)."""
    rows, cols = words.shape
    words = words.astype(np.int32, copy=False)
    if bits in (2, 4, 8):
        per = 32 // bits
        shifts = np.arange(0, 32, bits, dtype=np.int32).reshape(1, per, 1)
        return ((words[:, None, :] >> shifts) & ((1 << bits) - 1)).reshape(rows * per, cols)
    if bits != 3:
        raise ValueError(f"{bits}-bit GPTQ packing is not supported")
    w = words.reshape(rows // 3, 3, cols).astype(np.int64) & 0xFFFFFFFF
    lo = w[:, 0] | (w[:, 1] << 32)  # bits 0..63 of each 96-bit triple (bit 63 may set the sign: masked below)
    hi = w[:, 1] | (w[:, 2] << 32)  # bits 32..95
    parts = [(lo >> (3 * j)) & 7 for j in range(21)] + [(hi >> (3 * j - 32)) & 7 for j in range(21, 32)]
    return np.stack(parts, axis=1).reshape(rows // 3 * 32, cols).astype(np.int32)


def _declared(qc: dict[str, Any]) -> tuple[str, bool | None]:
    fmt = qc.get("checkpoint_format", qc.get("format"))
    fmt = fmt if isinstance(fmt, str) else "gptq"
    sym = qc.get("sym")
    return fmt, sym if isinstance(sym, bool) else None


def group_names(ctx: Context, method: str) -> list[str]:
    """Prefixes ``X`` with unclaimed ``X.qweight``, ``X.qzeros`` and ``X.scales``."""
    return sorted(
        n[: -len(".qweight")]
        for n in ctx.names
        if n.endswith(".qweight")
        and ctx.free(n)
        and ctx.free(n[: -len(".qweight")] + ".scales")
        and ctx.free(n[: -len(".qweight")] + ".qzeros")
    )


class Gptq:
    name = "gptq"

    def detect(self, ctx: Context) -> list[QuantizedWeight]:
        method = str(ctx.qc.get("quant_method", "")).lower()
        if method not in ("gptq", ""):
            return []
        fmt, sym = _declared(ctx.qc)
        bits_cfg = ctx.qc.get("bits")
        bits_cfg = bits_cfg if type(bits_cfg) is int else None
        found = []
        for x in group_names(ctx, "gptq"):
            qw, qz, sc = x + ".qweight", x + ".qzeros", x + ".scales"
            gi: str | None = x + ".g_idx" if x + ".g_idx" in ctx.names else None
            qs, zs, ss = ctx.shape(qw), ctx.shape(qz), ctx.shape(sc)
            if len(qs) != 2 or len(zs) != 2 or len(ss) != 2 or qs[1] != ss[1]:
                continue  # not GPTQ's layout (AWQ's shares the names): left to the formats after this one
            tags = ctx.tag(qw), ctx.tag(qz), ctx.tag(sc)
            n_out, groups = ss[1], ss[0]
            bits = bits_cfg or (zs[1] * 32 // n_out if n_out else 0)
            why = None
            if tags[0] != "I32" or tags[1] != "I32":
                why = f"GPTQ qweight/qzeros stored as {tags[0]}/{tags[1]} (only int32 words are read)"
            elif tags[2] not in ("F16", "BF16", "F32"):
                why = f"scales {sc} are {tags[2]}"
            elif bits not in (2, 3, 4, 8):
                why = f"{bits}-bit GPTQ (2, 3, 4 and 8 bits are read)"
            elif fmt not in CONVENTIONS:
                why = f"checkpoint_format {fmt!r} packs differently (gptq and gptq_v2 are read)"
            elif qs[0] * 32 % bits or zs[1] * 32 < n_out * bits or (bits == 3 and qs[0] % 3):
                why = f"qweight {qs} / qzeros {zs} do not fit {bits}-bit packing of {n_out} outputs"
            n_in = qs[0] * 32 // bits if not why else 0
            if gi is not None and not why:
                gshape = ctx.shape(gi)
                if (
                    ctx.tag(gi) not in ("I32", "I64")
                    or len(gshape) != 1
                    or gshape[0] > n_in
                    or gshape[0] <= 0
                ):
                    why = f"g_idx {gi} {gshape} does not fit {n_in} inputs"
                else:
                    n_in = gshape[0]  # packed words may end with padding codes
            if not why and (groups <= 0 or not n_out or not n_in):
                why = f"scales {ss} hold no group"
            if why:
                ctx.skip(qw, tags[0], why, qz, sc, gi)
                continue
            gs = self._group_size(ctx, gi, n_in, groups)
            if isinstance(gs, str):
                ctx.skip(qw, "I32", gs, qz, sc, gi)
                continue
            k = 1 if gs is None else 32 // math.gcd(gs * bits, 32)
            lay = GptqLayout(bits, n_in, n_out, groups, gs, qz, gi, fmt, sym, k)
            found.append(QuantizedWeight(qw, "gptq", sc, self, lay))
            ctx.claim(qw, qz, sc, gi)
        return found

    @staticmethod
    def _group_size(ctx: Context, gi: str | None, n_in: int, groups: int) -> int | None | str:
        """Inputs per group when groups are runs of consecutive inputs; None for act-order; a reason
        string when ``g_idx`` names a group that does not exist."""
        gs = -(-n_in // groups)
        if gi is None:
            return gs
        g = ctx.ck.array(gi).reshape(-1).astype(np.int64)
        lo, hi = int(g.min()), int(g.max())
        if lo < 0 or hi >= groups:
            return f"g_idx holds group {lo if lo < 0 else hi}, outside the {groups} groups of the scales"
        if np.array_equal(g, np.arange(g.size) // gs):
            return gs
        return None

    def _zeros(self, ck: Checkpoint, lay: GptqLayout) -> np.ndarray:
        """Stored zero codes ``[groups, out]`` (int32), as the file holds them."""
        qz = ck.array(lay.qzeros).astype(np.int32)
        return gptq_codes(np.ascontiguousarray(qz.T), lay.bits).T[: lay.groups, : lay.n_out]

    def blocks(self, ck: Checkpoint, q: QuantizedWeight) -> Blocks:
        lay: GptqLayout = q.layout
        stored = self._zeros(ck, lay)
        scales = scale_values(ck, q.scale)
        extra, faults = self._convention(stored, lay, scales)
        maxq = (1 << lay.bits) - 1
        # what gptqmodel loads: v1 zeros shifted up by one, field by field, modulo 2**bits
        zero = (stored + 1) & maxq if lay.convention == "gptq" else stored
        q.cache["zero"] = zero
        bound = np.maximum(np.maximum(zero, maxq - zero), 0).astype(np.float32).reshape(-1)
        n = lay.groups * lay.n_out
        if lay.group_size is None:
            stripe_of, n_stripes, per = np.zeros(n, dtype=np.int64), 1, lay.n_in * lay.n_out * 4
        else:
            g = lay.groups_per_stripe
            stripe_of = (np.arange(n, dtype=np.int64) // lay.n_out) // g
            n_stripes = -(-lay.groups // g)
            per = g * lay.group_size * lay.n_out * 4 * 2  # int32 codes, twice (max and min)
        sizes = None  # act-order: g_idx decides how many inputs a group holds
        if lay.group_size is not None:
            per_group = np.minimum(
                lay.group_size, lay.n_in - np.arange(lay.groups, dtype=np.int64) * lay.group_size
            )
            sizes = np.repeat(np.maximum(per_group, 0), lay.n_out)
        return Blocks(
            scales,
            [lay.groups, lay.n_out],
            bound,
            stripe_of,
            n_stripes,
            per,
            extra_bad=extra,
            extra_faults=faults,
            sizes=sizes,
        )

    @staticmethod
    def _convention(
        stored: np.ndarray, lay: GptqLayout, scales: np.ndarray
    ) -> tuple[list[dict[str, Any]], int]:
        """With ``sym: true``, the zero points against the declared convention (one summary entry);
        ``scales``: float32, flat."""
        if lay.sym is not True:
            return [], 0
        mid = 1 << (lay.bits - 1)
        expected = mid - 1 if lay.convention == "gptq" else mid
        wrong = stored != expected
        if not bool(wrong.any()):
            return [], 0
        n_v1, n_v2 = int((stored == mid - 1).sum()), int((stored == mid).sum())
        found = "gptq" if n_v1 == stored.size else "gptq_v2" if n_v2 == stored.size else None
        i = int(np.flatnonzero(wrong.reshape(-1))[0])
        g, o = divmod(i, lay.n_out)
        v = float(scales.reshape(-1)[i])
        entry = {
            "index": [g, o],
            "scale": "nan" if v != v else ("inf" if math.isinf(v) else v),
            "problem": "zero_point",
            "zero_point": int(stored[g, o]),
            "expected": expected,
            "declared": lay.convention,
            "found": found,
            "n_groups": int(wrong.sum()),
        }
        return [entry], 1

    def window(
        self, ck: Checkpoint, q: QuantizedWeight, first: int, count: int
    ) -> Iterator[tuple[np.ndarray, ...]]:
        lay: GptqLayout = q.layout
        zero = q.cache["zero"]
        row_bytes = lay.n_out * 4
        if lay.group_size is None:  # act-order: the whole tensor, in chunks of 32-input word rows
            yield np.arange(lay.groups * lay.n_out, dtype=np.int64), self._scattered(ck, q, zero)
            return
        k, gs = lay.groups_per_stripe, lay.group_size
        g0, g1 = first * k, min(lay.groups, (first + count) * k)
        i0, i1 = g0 * gs, min(lay.n_in, g1 * gs)
        r0, r1 = i0 * lay.bits // 32, -(-i1 * lay.bits // 32)
        if lay.bits == 3:
            r0, r1 = r0 - r0 % 3, min(-(-r1 // 3) * 3, _rows(ck, q.name, row_bytes))
        words = (
            ck.read_bytes(q.name, r0 * row_bytes, (r1 - r0) * row_bytes).view("<i4").reshape(-1, lay.n_out)
        )
        codes = gptq_codes(words, lay.bits)
        c0 = i0 - r0 * 32 // lay.bits
        codes = codes[c0 : c0 + (i1 - i0)]
        n = g1 - g0
        pad = n * gs - codes.shape[0]
        if pad:  # the last group may be short: pad with copies of its first row (max and min unchanged)
            codes = np.concatenate([codes, np.broadcast_to(codes[-1:], (pad, codes.shape[1]))])
        c = codes.reshape(n, gs, lay.n_out)
        hi, lo = c.max(axis=1), c.min(axis=1)
        z = zero[g0:g1]
        m = np.maximum(np.maximum(hi - z, z - lo), 0).astype(np.float32)
        yield np.arange(g0 * lay.n_out, g1 * lay.n_out, dtype=np.int64), m.reshape(-1)

    def _scattered(self, ck: Checkpoint, q: QuantizedWeight, zero: np.ndarray) -> np.ndarray:
        """Act-order: ``max |q - z|`` per (group, out), inputs gathered to their group by ``g_idx``."""

        lay: GptqLayout = q.layout
        assert lay.g_idx is not None  # act-order (no group size) is found from a g_idx only
        g_idx = ck.array(lay.g_idx).reshape(-1).astype(np.int64)
        out = np.zeros((lay.groups, lay.n_out), dtype=np.int32)
        row_bytes = lay.n_out * 4
        unit = 3 if lay.bits == 3 else 1  # word rows that hold whole codes
        step = max(unit, (sf.PIECE // 64 // row_bytes) // unit * unit)
        total = _rows(ck, q.name, row_bytes)
        for r0 in range(0, total, step):
            r1 = min(total, r0 + step)
            words = ck.read_bytes(q.name, r0 * row_bytes, (r1 - r0) * row_bytes).view("<i4")
            codes = gptq_codes(words.reshape(-1, lay.n_out), lay.bits)
            i0 = r0 * 32 // lay.bits
            n = min(codes.shape[0], lay.n_in - i0)
            if n <= 0:
                break
            gi = g_idx[i0 : i0 + n]
            diff = np.abs(codes[:n] - zero[gi])
            np.maximum.at(out, gi, diff)  # per group, the max over the inputs g_idx sends there
        return out.astype(np.float32).reshape(-1)


def _rows(ck: Checkpoint, name: str, row_bytes: int) -> int:
    return ck.nbytes_of(name) // row_bytes
