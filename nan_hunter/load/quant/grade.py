"""Judging one quantized weight from its scales, reading only the data the answer depends on.

Per block (a group, an absmax block, an SCB row, a GGUF block): a NaN or Inf scale is bad whatever
the block holds; a zero scale is bad when the block holds data (some code differs from its zero
point: the block dequantizes to 0 instead of its values); a negative scale is listed (a fault only
where the format says a sign is wrong). The dequantized absmax is ``max(|code - zero| * |scale|)``
over the blocks with a finite scale, times the global scale.

Which data is read. A block's magnitude ``m = max |code - zero|`` is at most the format's ``bound``
(448 for e4m3, 8 for symmetric int4, 127 for int8, ...), so a block whose ``bound * |scale|`` is
below the largest ``m * |scale|`` already known cannot be the absmax. The blocks are visited by
that upper bound, largest first, a growing batch at a time, until no unread block can beat the
answer; zero-scale blocks are read to see whether they hold data. Real weights use their codes'
full range in nearly every block, so a few stripes answer exactly. When the candidates would cover
more than a quarter of the stripes (an adversarial or degenerate file), every stripe is read in
windows of about ``PIECE`` bytes instead. Either way the answer is exact and memory stays one window.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .. import safetensors_file as sf
from .base import BF16_MAX, FP16_MAX, MAX_BAD_BLOCKS, Blocks, QuantizedScan, QuantizedWeight, unravel

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint import Checkpoint

FULL_PASS_FRACTION = 4  # read everything once the stripes needed pass 1/4 of all stripes


class _Reader:
    """Stripes read so far; the magnitudes they gave, kept only where they are needed (the blocks with a
    zero scale); the largest ``m * |scale|`` over the usable blocks read (``best``)."""

    def __init__(
        self,
        ck: Checkpoint,
        q: QuantizedWeight,
        b: Blocks,
        weight: np.ndarray,
        usable_exc: np.ndarray,
        zero_idx: np.ndarray,
    ) -> None:

        self.ck, self.q, self.b = ck, q, b
        self.weight = weight  # per block: |scale| (or 1 for absolute magnitudes)
        self.unusable = usable_exc  # sorted int64: blocks left out of the absmax
        self.zero_idx = zero_idx  # sorted int64: blocks with a zero scale (their "holds data" is wanted)
        self.zero_holds = np.zeros(zero_idx.size, dtype=bool)
        self.read = np.zeros(max(1, b.n_stripes), dtype=bool)
        self.per_window = max(1, sf.PIECE // max(1, b.stripe_bytes))
        self.n_read = 0
        self.best = -1.0

    def stripes(self, wanted: np.ndarray) -> None:
        """Read the stripes in ``wanted`` (int64 array) not read yet, runs of consecutive ones
        together, at most ``per_window`` stripes per window."""
        s = np.unique(wanted)
        s = s[~self.read[s]]
        if not s.size:
            return
        ids = s.tolist()
        start = prev = ids[0]
        for x in ids[1:] + [None]:
            if x is not None and x == prev + 1 and x - start < self.per_window:
                prev = x
                continue
            self._window(start, prev - start + 1)
            if x is not None:
                start = prev = x

    def everything(self) -> None:
        self.stripes(np.arange(self.b.n_stripes, dtype=np.int64))

    def _window(self, first: int, count: int) -> None:
        for got in self.q.handler.window(self.ck, self.q, first, count):
            idx, m = got[0], got[1].astype(np.float32, copy=False)
            holds = got[2] if len(got) > 2 else m > 0
            if self.zero_idx.size:
                pos = np.minimum(np.searchsorted(self.zero_idx, idx), self.zero_idx.size - 1)
                hit = self.zero_idx[pos] == idx
                self.zero_holds[pos[hit]] = holds[hit]
            contrib = m * self.weight[idx]
            if self.unusable.size:
                pos = np.minimum(np.searchsorted(self.unusable, idx), self.unusable.size - 1)
                contrib = np.where(self.unusable[pos] == idx, np.float32(-1.0), contrib)
            if contrib.size:
                self.best = max(self.best, float(contrib.max()))
        self.read[first : first + count] = True
        self.n_read += count


def check(ck: Checkpoint, q: QuantizedWeight) -> QuantizedScan:
    """Bad blocks, dequantized absmax and fp16/bf16 overflow of one quantized weight.

    Few passes over the scales (they can be an eighth of the data's size, GGUF's d): one for the
    positive finite ones, then only the exceptions are looked at one by one; the upper bounds once, and
    a partial sort (``argpartition``) over them a few times."""
    b = q.handler.blocks(ck, q)
    s = np.asarray(b.values, dtype=np.float32).reshape(-1)
    n = s.size
    out = QuantizedScan(q.name, q.format, q.scale, n)
    if b.stripe_of is not None and b.stripe_of.size != n:
        out.skipped = f"scale {q.scale} has {n} values for {b.stripe_of.size} blocks"
        return out
    normal = (s > 0) & (s < math.inf)
    exc = np.flatnonzero(~normal)  # NaN, Inf, zero, negative: usually none
    ev = s[exc]
    nonfinite = exc[~np.isfinite(ev)]
    zero_idx = exc[ev == 0]
    neg_idx = exc[ev < 0]
    unusable = (
        nonfinite if b.exclude is None else np.unique(np.concatenate([nonfinite, np.flatnonzero(b.exclude)]))
    )
    weight = np.ones_like(s) if b.absolute else np.abs(s)
    r = _Reader(ck, q, b, weight, unusable, zero_idx)
    known = b.known
    stripe_of = b.stripe_of if b.n_stripes > 0 else None  # None: no data to read
    limit = max(1, b.n_stripes // FULL_PASS_FRACTION)
    if known is not None:  # magnitudes known without reading (padding, activation scales)
        k = np.asarray(known, dtype=np.float32).reshape(-1)
        got = np.flatnonzero(k >= 0)
        if got.size:
            contrib = k[got] * weight[got]
            contrib[np.isin(got, unusable)] = -1.0
            r.best = max(r.best, float(contrib.max()))
            if zero_idx.size:
                hit = np.isin(zero_idx, got)
                r.zero_holds[hit] = k[zero_idx[hit]] > 0
    need = (
        zero_idx if known is None else zero_idx[np.asarray(known).reshape(-1)[zero_idx] < 0]
    )  # padding is known empty
    if stripe_of is not None and not b.zero_is_fault and need.size:
        wanted = np.unique(stripe_of[need])
        if wanted.size > limit:
            r.everything()
        else:
            r.stripes(wanted)
    if stripe_of is not None:
        _absmax_candidates(r, weight, unusable, b, stripe_of, limit, known)
    zero_bad = zero_idx if b.zero_is_fault else zero_idx[r.zero_holds]
    listed = [nonfinite, zero_bad] + ([neg_idx] if b.negative_listed else [])
    bad = np.sort(np.concatenate(listed))
    out.n_bad = int(bad.size) + len(b.extra_bad)
    out.n_faults = (
        int(nonfinite.size + zero_bad.size + (neg_idx.size if b.negative_is_fault else 0)) + b.extra_faults
    )
    out.bad_blocks = list(b.extra_bad)
    for i in bad[:MAX_BAD_BLOCKS].tolist():
        v = float(s[i])
        problem = "nan" if v != v else "inf" if math.isinf(v) else "zero" if v == 0 else "negative"
        out.bad_blocks.append(
            {
                "index": unravel(i, b.shape),
                "scale": "nan" if v != v else ("inf" if math.isinf(v) else v),
                "problem": problem,
            }
        )
    gm = abs(b.multiplier)
    out.nonfinite_blocks, out.dequant_nonfinite = _nonfinite(b, unusable, n, gm)
    if r.best >= 0 and math.isfinite(gm):
        out.dequant_absmax = r.best * gm
    if out.dequant_absmax is not None and not math.isfinite(out.dequant_absmax):
        # |code| x scale past float32's range: non-finite values, how many is not counted
        out.dequant_absmax, out.dequant_nonfinite = None, None
        out.nonfinite_blocks = max(1, out.nonfinite_blocks)
    some_nonfinite = out.nonfinite_blocks > 0 or bool(out.dequant_nonfinite)
    if out.nonfinite_blocks == n and n:  # every value non-finite: no finite absmax to give
        out.dequant_absmax = None
    if b.bound_only:
        bound = out.dequant_absmax
        out.dequant_absmax = None
        out.overflows = {
            "fp16": True if some_nonfinite else False if bound is not None and bound <= FP16_MAX else None,
            "bf16": True if some_nonfinite else False if bound is not None and bound <= BF16_MAX else None,
        }
    else:
        a = out.dequant_absmax
        out.overflows = {
            "fp16": some_nonfinite or bool(a is not None and a > FP16_MAX),
            "bf16": some_nonfinite or bool(a is not None and a > BF16_MAX),
        }
    out.stripes_read = r.n_read
    return out


def _nonfinite(b: Blocks, unusable: np.ndarray, n: int, gm: float) -> tuple[int, int | None]:
    """(blocks, values) that dequantize to NaN/Inf because of a scale: every value of a block whose
    scale (or dmin) is NaN/Inf (a zero code times inf is NaN, too), every block under a NaN/Inf global
    scale. The count is None where the format gives no block sizes, or a bad table (a NaN quant map
    entry) makes some codes non-finite."""
    if not math.isfinite(gm):
        blocks = np.arange(n, dtype=np.int64)
    else:
        blocks = unusable
        if any(not e.get("index") and e.get("problem") in ("nan", "inf") for e in b.extra_bad):
            return max(1, int(blocks.size)), None
    if not blocks.size:
        return 0, 0
    if b.sizes is None:
        return int(blocks.size), None
    if isinstance(b.sizes, (int, np.integer)):
        return int(blocks.size), int(blocks.size) * int(b.sizes)
    return int(blocks.size), int(np.asarray(b.sizes, dtype=np.int64).reshape(-1)[blocks].sum())


def _absmax_candidates(
    r: _Reader,
    weight: np.ndarray,
    unusable: np.ndarray,
    b: Blocks,
    stripe_of: np.ndarray,
    limit: int,
    known: np.ndarray | None,
) -> None:
    """Read stripes, largest possible contribution first, until no unread block can beat the
    largest known ``m * |scale|`` (or read them all when that is cheaper). The bound of every block
    outside the ``k`` largest is at most the ``k + 1``-th largest, so the ``k + 1`` largest answer it."""
    bound = (
        b.bound if isinstance(b.bound, (int, float)) else np.asarray(b.bound, dtype=np.float32).reshape(-1)
    )
    upper = weight * bound if not isinstance(bound, (int, float)) else weight * np.float32(bound)
    upper = upper.astype(np.float32, copy=True)
    if unusable.size:
        upper[unusable] = -1.0
    if known is not None:  # already counted in ``best``
        upper[np.asarray(known).reshape(-1) >= 0] = -1.0
    n = upper.size
    k = 1
    while True:
        vals, idx = _largest(upper, min(n, k + 1))
        if float(vals[0]) < 0 or float(vals[0]) <= r.best:
            return
        wanted = np.unique(stripe_of[idx[:k]])
        wanted = wanted[~r.read[wanted]]
        if r.n_read + wanted.size > limit:
            r.everything()
            return
        r.stripes(wanted)
        if k >= n or float(vals[-1]) <= r.best:
            return
        k *= 8


def _largest(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest values of 1-D ``x``, largest first, and their indices (NaN counts as largest,
    as a sort puts it last)."""
    idx = np.argpartition(x, x.size - k)[x.size - k :] if k < x.size else np.arange(x.size)
    idx = idx[np.argsort(x[idx], kind="stable")[::-1]]
    return x[idx], idx
