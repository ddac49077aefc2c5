"""Quantized weights and their scales: which blocks have a bad scale, and what the dequantized
weights would do in the compute dtype.

Formats, as the libraries that write them store them (read from their sources):
- ``fp8_block``: transformers' finegrained fp8 / DeepSeek-V3: ``X.weight`` fp8 ``[out, in]`` and
  ``X.weight_scale_inv`` fp32 ``[ceil(out/b0), ceil(in/b1)]`` (``quantization_config.weight_block_size``,
  128x128), dequantized as ``w * scale_inv``; also compressed-tensors' fp8 group scales
  (``X.weight_scale`` ``[out, in/g]``).
- ``fp8_channel`` / ``fp8_tensor``: ``X.weight`` fp8 with ``X.weight_scale`` ``[out, 1]`` / one
  value (compressed-tensors ``float-quantized``, modelopt FP8): ``w * scale``.
- ``mxfp4``: gpt-oss: ``X_blocks`` uint8 ``[..., G, 16]`` (32 fp4 E2M1 values per block, low nibble
  first) and ``X_scales`` uint8 ``[..., G]`` E8M0 exponents: ``fp4 * 2**(s - 127)``; 0xFF is NaN.
- ``nvfp4``: ``X.weight`` (modelopt) or ``X.weight_packed`` (compressed-tensors) uint8 ``[out, in/2]``
  fp4, ``X.weight_scale`` fp8 ``[out, in/16]``, and a global scale: modelopt's ``X.weight_scale_2``
  multiplies, compressed-tensors' ``X.weight_global_scale`` divides.
- ``int_group``: compressed-tensors ``pack-quantized``: ``X.weight_packed`` int32 (32 values of
  ``num_bits`` bits densely packed into ``num_bits`` words, stored as ``q + 2**(bits-1)``),
  ``X.weight_scale`` ``[out, in/group]``, optional ``X.weight_zero_point`` (packed along dim 0),
  ``X.weight_shape``; ``int-quantized``: ``X.weight`` int8 with ``X.weight_scale``.
  Dequantized as ``(q - zero_point) * scale``.

Per block the largest quantized magnitude is computed on the raw bytes, stripe by stripe (a stripe
is one row of blocks; memory stays one window whatever the tensor's size); the scale tensor is read
whole (it is 16 to 16384 times smaller than the data). Then, per block: a NaN or Inf scale, or a
zero scale on a block holding non-zero data, is bad (a fault: every dequantized value of the block
is NaN, Inf or silently 0); a negative scale is listed. The dequantized absmax is the largest
``block magnitude * |scale|`` (times the global scale) over the good blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .bit_dtypes import code_values

if TYPE_CHECKING:  # pragma: no cover
    from .checkpoint import Checkpoint

MAX_BAD_BLOCKS = 1000  # listed per tensor; n_bad counts them all
FP16_MAX, BF16_MAX = 65504.0, 3.3895313892515355e38
_FP8_BYTES = {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}
_SCALE_TAGS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "U8"}
_DATA_TAGS = _FP8_BYTES | {"U8", "I8", "I32"}


@dataclass
class QuantizedWeight:
    """One quantized weight as found: which tensors, how its blocks are laid out."""

    name: str  # the tensor holding the quantized values
    format: str  # fp8_block | fp8_channel | fp8_tensor | mxfp4 | nvfp4 | int_group
    scale: str
    rows: int  # data rows (leading dims flattened) and elements per row
    cols: int
    block: tuple[int, int]  # (rows, elements) per block
    global_scale: str | None = None
    global_divides: bool = False
    zero_point: str | None = None
    bits: int = 8


@dataclass
class QuantizedScan:
    name: str
    format: str
    scale: str
    n_blocks: int
    bad_blocks: list[dict[str, Any]] = field(default_factory=list)
    n_bad: int = 0  # bad blocks, all of them (bad_blocks lists the first MAX_BAD_BLOCKS)
    dequant_absmax: float | None = None
    overflows: dict[str, bool] = field(default_factory=dict)
    skipped: str | None = None  # why it could not be checked (then it is listed in weights.unchecked)

    @property
    def faulty(self) -> bool:
        return any(b["problem"] != "negative" for b in self.bad_blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "scale": self.scale, "n_blocks": self.n_blocks,
                "bad_blocks": self.bad_blocks, "n_bad": self.n_bad, "dequant_absmax": self.dequant_absmax,
                "overflows": self.overflows}


# --- recognition ----------------------------------------------------------------------------


def quantization_config(ck: Checkpoint) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` (``{}`` when there is none)."""
    from . import bounded_json
    from .regular_file import read_regular

    if ck.config_path is None:
        return {}
    try:
        data = bounded_json.loads(read_regular(ck.config_path, "config", 16 << 20), str(ck.config_path),
                                  constants=True)
    except Exception:  # noqa: BLE001 - a broken config.json is reported where the model is built
        return {}
    q = data.get("quantization_config") if isinstance(data, dict) else None
    return q if isinstance(q, dict) else {}


def _int_params(qc: dict[str, Any]) -> tuple[int | None, int | None]:
    """(num_bits, group_size) of compressed-tensors' weight scheme, when the config gives them."""
    groups = qc.get("config_groups")
    if isinstance(groups, dict):
        for g in groups.values():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict):
                bits, gs = w.get("num_bits"), w.get("group_size")
                return (bits if isinstance(bits, int) else None), (gs if isinstance(gs, int) else None)
    return None, None


def _tag(ck: Checkpoint, name: str) -> str:
    """The safetensors dtype tag of tensor ``name`` (mapped from torch's dtype for ``.pt``)."""
    e = ck.entry(name)
    if e is not None:
        return e.dtype
    from .safetensors_header import TORCH_DTYPES

    t = str(ck.tensor(name).dtype).removeprefix("torch.")
    return next((k for k, v in TORCH_DTYPES.items() if v == t), t)


def _block_of(n: int, n_scales: int, given: int | None) -> int | None:
    """Elements per block along a dim of ``n`` elements with ``n_scales`` scales."""
    if given and -(-n // given) == n_scales:
        return given
    if n_scales <= 0:
        return None
    b = 1
    while -(-n // b) > n_scales:
        b *= 2
    return b if -(-n // b) == n_scales else (n // n_scales if n % n_scales == 0 else None)


def _rows_cols(shape: list[int] | tuple[int, ...]) -> tuple[int, int]:
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def find_quantized(ck: Checkpoint) -> tuple[list[QuantizedWeight], list[dict[str, str]]]:
    """Quantized weights of ``ck`` (from tensor names, with ``quantization_config`` for block and
    group sizes), and the ones found that cannot be checked (``{name, dtype, reason}``)."""
    qc = quantization_config(ck)
    names = set(ck.names())

    def tag(n: str) -> str:
        return _tag(ck, n)

    def shape(n: str) -> list[int]:
        e = ck.entry(n)
        return list(e.shape) if e is not None else list(ck.tensor(n).shape)

    found: list[QuantizedWeight] = []
    bad: list[dict[str, str]] = []
    wbs = qc.get("weight_block_size")
    given = wbs if isinstance(wbs, list) and len(wbs) == 2 and all(isinstance(x, int) for x in wbs) else None
    bits_cfg, group_cfg = _int_params(qc)
    for s in sorted(names):
        if s.endswith("_scales") and s[: -len("_scales")] + "_blocks" in names:  # mxfp4 (gpt-oss)
            data = s[: -len("_scales")] + "_blocks"
            ds, ss = shape(data), shape(s)
            if len(ds) >= 2 and ds[:-1] == ss and ds[-1] == 16 and tag(data) == "U8" and tag(s) in ("U8", "F8_E8M0") \
                    and math.prod(ds):
                found.append(QuantizedWeight(data, "mxfp4", s, _rows_cols(ss)[0], ss[-1] * 32, (1, 32), bits=4))
            else:
                bad.append({"name": data, "dtype": tag(data), "reason": f"mxfp4 blocks {ds} do not match scales {ss}"})
            continue
        inv = s.endswith(".weight_scale_inv")
        if not (inv or s.endswith(".weight_scale")):
            continue
        prefix = s[: -len("_scale_inv" if inv else "_scale")]  # "X.weight"
        packed = prefix + "_packed"
        data = packed if packed in names else prefix if prefix in names else None
        if data is None:
            continue
        dt, ds, ss = tag(data), shape(data), shape(s)
        if tag(s) not in _SCALE_TAGS or tag(data) not in _DATA_TAGS:
            continue  # not a quantized weight nanhunter knows (a scale must be a number it can read)
        if not math.prod(ds) or not math.prod(ss):
            continue  # empty: nothing to dequantize
        rows, cols = _rows_cols(ds)
        srows, scols = _rows_cols(ss)
        n_scales = math.prod(ss) if ss else 1
        q: QuantizedWeight | None = None
        if dt == "U8" and tag(s) in ("U8", "F8_E8M0") and prefix + "_global_scale" not in names:
            cols *= 2  # compressed-tensors mxfp4: fp4 pairs, E8M0 exponents per 32 values
            if srows == rows and _block_of(cols, scols, 32) == 32:
                q = QuantizedWeight(data, "mxfp4", s, rows, cols, (1, 32), bits=4)
        elif dt == "U8" and (prefix + "_scale_2" in names or prefix + "_global_scale" in names or tag(s) == "F8_E4M3"):
            cols *= 2  # two fp4 values per byte
            g2 = prefix + "_scale_2" if prefix + "_scale_2" in names else (
                prefix + "_global_scale" if prefix + "_global_scale" in names else None)
            if g2 is not None and (tag(g2) not in _SCALE_TAGS or not math.prod(shape(g2))):
                g2 = None
            bc = _block_of(cols, scols, 16)
            if srows == rows and bc:
                q = QuantizedWeight(data, "nvfp4", s, rows, cols, (1, bc), g2, g2 is not None and g2.endswith(
                    "_global_scale"), bits=4)
        elif dt in _FP8_BYTES:
            if n_scales == 1:
                q = QuantizedWeight(data, "fp8_tensor", s, rows, cols, (rows, cols))
            elif srows == rows and scols == 1:
                q = QuantizedWeight(data, "fp8_channel", s, rows, cols, (1, cols))
            else:
                br = _block_of(rows, srows, given[0] if given else None)
                bc = _block_of(cols, scols, given[1] if given else None)
                # leading dims (MoE experts) flatten into rows: only exact when each expert's rows
                # are whole blocks, else a block would mix two experts (listed as not checked)
                if br and bc and (len(ds) <= 2 or (ds[-2] % br == 0 and ds[:-2] == ss[:-2])):
                    q = QuantizedWeight(data, "fp8_block", s, rows, cols, (br, bc))
        elif dt == "I32" and data == packed:
            shp = prefix + "_shape"
            true_cols = None
            if shp in names and tag(shp) in ("I64", "I32", "U64", "U32", "I16", "U16", "I8", "U8"):
                v = ck.tensor(shp).reshape(-1).tolist()
                true_cols = int(v[-1]) if v and 0 < int(v[-1]) <= cols * 32 else None
            bits = bits_cfg or (round(cols * 32 / true_cols) if true_cols else 4)
            cols = true_cols or cols * 32 // bits
            if srows == rows and 1 <= bits <= 8:
                bc = group_cfg if group_cfg and -(-cols // group_cfg) == scols else _block_of(cols, scols, None)
                zp = prefix + "_zero_point"
                if zp in names and tag(zp) not in ("I32", "I8"):
                    bc = None  # a zero point nanhunter cannot read: listed as not checked
                if bc:
                    q = QuantizedWeight(data, "int_group", s, rows, cols, (1, bc), zero_point=zp if zp in names else None,
                                        bits=bits)
        elif dt == "I8":
            if n_scales == 1:
                q = QuantizedWeight(data, "int_group", s, rows, cols, (rows, cols), bits=8)
            elif srows == rows:
                bc = _block_of(cols, scols, group_cfg)
                if bc:
                    q = QuantizedWeight(data, "int_group", s, rows, cols, (1, bc), bits=8)
        if q is None:
            bad.append({"name": data, "dtype": dt, "reason": f"scale {s} {ss} does not match its data {ds} in any "
                        "known quantized format"})
        else:
            found.append(q)
    return found, bad


# --- block magnitudes from raw bytes ---------------------------------------------------------


def _fp8_mags(tag: str) -> Callable[[Any, int, int], Any]:
    """Per-block largest |value| of fp8 bytes ``[rows, cols]`` with blocks of ``br`` rows and ``bc``
    columns: magnitude codes (``b & 0x7F``) are ordered like their values, so the rows of a block
    are reduced first (an element-wise max, vectorised along the row), then each block's columns."""
    import torch

    vals = torch.tensor([abs(v) if v == v else 0.0 for v in code_values(tag)] if tag in (
        "F8_E4M3FNUZ", "F8_E5M2FNUZ") else _fp8_table(tag), dtype=torch.float32)
    bad = 0x7F if tag == "F8_E4M3" else 0x7C if tag == "F8_E5M2" else None  # NaN/Inf magnitude codes

    def mags(stripe, br: int, bc: int):
        rows, cols = stripe.shape
        m = stripe & 0x7F
        k = -(-rows // br)
        if k * br != rows:
            m = torch.nn.functional.pad(m, (0, 0, 0, k * br - rows))
        r = m.reshape(k, br, cols).amax(dim=1)
        if bad is not None and bool((r >= bad).any()):  # NaN/Inf bytes (reported by the plain scan): left out
            m = torch.where(m >= bad, 0, m)
            r = m.reshape(k, br, cols).amax(dim=1)
        return vals[_block_max(r, bc).long()]

    return mags


def _fp8_table(tag: str) -> list[float]:
    import torch

    dt = torch.float8_e4m3fn if tag == "F8_E4M3" else torch.float8_e5m2
    v = torch.arange(256, dtype=torch.uint8).view(dt).float().abs()
    return torch.where(torch.isfinite(v), v, 0.0).tolist()


def _block_max(m, bc: int):
    """``m`` ``[r, cols]`` (one block-row per ``br`` rows reduced by the caller) → ``[r, ceil(cols/bc)]``."""
    import torch

    r, c = m.shape
    nb = -(-c // bc)
    if nb * bc != c:
        m = torch.nn.functional.pad(m, (0, nb * bc - c))
    return m.reshape(r, nb, bc).amax(dim=-1)


_F4_MAG = [abs(v) for v in code_values("F4")]


def _fp4_mags(stripe, bc: int):
    """fp4 E2M1 packed two per byte: block of ``bc`` values is ``bc // 2`` bytes."""
    import torch

    m = torch.maximum(stripe & 0x7, (stripe >> 4) & 0x7)
    return torch.tensor(_F4_MAG, dtype=torch.float32)[_block_max(m, bc // 2).long()]


def _unpack_ints(words, bits: int):
    """compressed-tensors ``pack_to_int32`` undone: int32 ``[r, w]`` → unsigned ``bits``-bit codes
    ``[r, w * 32 // bits]`` (a little-endian bit stream, element i at bits ``i*bits``)."""
    import torch

    r, w = words.shape
    b = words.contiguous().view(torch.uint8).reshape(r, w * 4)
    shifts = torch.arange(8, dtype=torch.uint8)
    bitstream = ((b.unsqueeze(-1) >> shifts) & 1).reshape(r, -1)  # [r, w*32] bits, LSB first
    n = bitstream.shape[1] // bits
    weights = (1 << torch.arange(bits, dtype=torch.int32))
    return (bitstream[:, : n * bits].reshape(r, n, bits).to(torch.int32) * weights).sum(-1)


# --- the check ---------------------------------------------------------------------------------


def _scale_values(ck: Checkpoint, name: str, e8m0: bool = False):
    """The scale tensor as float32 (E8M0 bytes decoded: 2**(s-127), 0xFF NaN)."""
    import torch

    t = ck.tensor(name)
    if e8m0 and t.dtype == torch.uint8:
        x = torch.pow(2.0, t.to(torch.float32) - 127)
        return torch.where(t == 0xFF, math.nan, x)
    return t.to(torch.float32)


def _row_bytes(ck: Checkpoint, q: QuantizedWeight) -> int:
    e = ck.entry(q.name)
    if e is not None:
        nbytes = e.nbytes
    else:
        t = ck.tensor(q.name)
        nbytes = t.numel() * t.element_size()
    return nbytes // max(1, q.rows)


def check_quantized(ck: Checkpoint, q: QuantizedWeight) -> QuantizedScan:
    """Bad blocks and dequantized absmax of one quantized weight (data read stripe by stripe)."""
    import torch

    data_tag = _tag(ck, q.name)
    scale = _scale_values(ck, q.scale, e8m0=q.format == "mxfp4")
    br, bc = q.block
    nbr, nbc = -(-q.rows // br), -(-q.cols // bc)
    out = QuantizedScan(q.name, q.format, q.scale, nbr * nbc)
    if scale.numel() != nbr * nbc:
        out.skipped = f"scale {q.scale} has {scale.numel()} values for {nbr * nbc} blocks"
        return out
    scale_shape = list(scale.shape)
    scale = scale.reshape(nbr, nbc)
    gscale = 1.0
    if q.global_scale is not None:
        g = float(ck.tensor(q.global_scale).to(torch.float32).reshape(-1)[0])
        gscale = (1.0 / g) if q.global_divides and g != 0 else (math.inf if q.global_divides else g)
    zp = None
    if q.zero_point is not None:
        zt = ck.tensor(q.zero_point)
        if zt.dtype == torch.int32:  # packed along dim 0, offset like the values
            zp = _unpack_ints(zt.t().contiguous(), q.bits)[:, : q.rows].t() - (1 << (q.bits - 1))
        else:
            zp = zt.to(torch.int32)
        zp = zp.reshape(q.rows, -1)[:, :nbc]
    mags = torch.zeros(nbr, nbc, dtype=torch.float32)
    row_bytes = _row_bytes(ck, q)
    fp8 = _fp8_mags(data_tag) if data_tag in _FP8_BYTES else None
    for first, piece in ck.byte_stripes(q.name, row_bytes * br):
        r0 = first // row_bytes
        if piece is None:
            continue  # zeros: magnitude 0
        rows = piece.numel() // row_bytes
        m = piece.reshape(rows, row_bytes)
        if q.format == "mxfp4" or q.format == "nvfp4":
            got = _fp4_mags(m, bc)
        elif fp8 is not None:  # rows already reduced block by block
            got = fp8(m, br, bc)
            mags[r0 // br: r0 // br + got.shape[0]] = torch.maximum(mags[r0 // br: r0 // br + got.shape[0]], got)
            continue
        elif q.format == "int_group":
            if data_tag == "I8":
                v = m.view(torch.int8).to(torch.int32)
            else:
                v = _unpack_ints(m.view(torch.int32), q.bits)[:, : q.cols] - (1 << (q.bits - 1))
            if zp is not None:
                v = v - zp[r0: r0 + rows].repeat_interleave(bc, dim=1)[:, : q.cols]
            got = _block_max(v.abs(), bc).to(torch.float32)
        else:  # pragma: no cover - find_quantized only builds the formats above
            raise AssertionError(q.format)
        if br > 1:  # several rows per block: reduce the stripe's rows block by block
            k = -(-rows // br)
            if k * br != rows:
                got = torch.nn.functional.pad(got, (0, 0, 0, k * br - rows))
            got = got.reshape(k, br, -1).amax(dim=1)
        mags[r0 // br: r0 // br + got.shape[0]] = torch.maximum(mags[r0 // br: r0 // br + got.shape[0]], got)
    _grade(out, scale, mags, gscale, scale_shape)
    return out


def _unravel(flat: int, shape: list[int]) -> list[int]:
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return out[::-1]


def _grade(out: QuantizedScan, scale, mags, gscale: float, shape: list[int]) -> None:
    """Bad blocks (indexed in the scale tensor's own ``shape``) and the dequantized absmax."""
    import torch

    nan, inf = torch.isnan(scale), torch.isinf(scale)
    zero = (scale == 0) & (mags > 0)
    neg = scale < 0
    bad = nan | inf | zero | neg
    out.n_bad = int(bad.sum())
    if not math.isfinite(gscale) or gscale == 0:
        out.n_bad += 1
        out.bad_blocks.append({"index": [], "scale": "nan" if gscale != gscale else ("inf" if gscale else 0.0),
                               "problem": "nan" if gscale != gscale else ("inf" if gscale else "zero")})
    for idx in bad.nonzero().tolist()[:MAX_BAD_BLOCKS]:
        s = float(scale[idx[0], idx[1]])
        idx = _unravel(idx[0] * scale.shape[1] + idx[1], shape)
        problem = "nan" if s != s else "inf" if math.isinf(s) else "zero" if s == 0 else "negative"
        out.bad_blocks.append({"index": idx, "scale": "nan" if s != s else ("inf" if math.isinf(s) else s),
                               "problem": problem})
    good = ~(nan | inf)
    if bool(good.any()) and math.isfinite(gscale):
        out.dequant_absmax = float((mags[good] * scale[good].abs()).max()) * abs(gscale)
    out.overflows = {"fp16": bool(out.dequant_absmax is not None and out.dequant_absmax > FP16_MAX),
                     "bf16": bool(out.dequant_absmax is not None and out.dequant_absmax > BF16_MAX)}


def scan_quantized(ck: Checkpoint) -> tuple[list[QuantizedScan], list[dict[str, str]]]:
    """Every quantized weight of ``ck`` checked; and those that could not be (for ``weights.unchecked``)."""
    found, unchecked = find_quantized(ck)
    out = []
    for q in found:
        try:
            r = check_quantized(ck, q)
        except (RuntimeError, ValueError, ZeroDivisionError, IndexError, OverflowError) as e:
            # shapes that name a known layout but do not fit it (a hostile or broken file): not checked,
            # and said so, rather than an internal error
            unchecked.append({"name": q.name, "dtype": q.format, "reason": f"does not fit the {q.format} layout "
                              f"({type(e).__name__}: {str(e)[:120]})"})
            continue
        if r.skipped:
            unchecked.append({"name": q.name, "dtype": q.format, "reason": r.skipped})
        else:
            out.append(r)
    return out, unchecked
