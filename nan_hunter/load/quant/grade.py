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

from .base import BF16_MAX, FP16_MAX, MAX_BAD_BLOCKS, Blocks, QuantizedScan, QuantizedWeight, unravel

if TYPE_CHECKING:  # pragma: no cover

    from ..checkpoint import Checkpoint

FULL_PASS_FRACTION = 4  # read everything once the stripes needed pass 1/4 of all stripes


class _Reader:
    """Stripes read so far, and the magnitudes they gave."""

    def __init__(self, ck: Checkpoint, q: QuantizedWeight, b: Blocks):
        import torch

        from ..safetensors_file import PIECE

        self.ck, self.q, self.b = ck, q, b
        self.mags = b.known.clone() if b.known is not None else torch.full((b.values.numel(),), -1.0)
        self.holds: torch.Tensor | None = None  # blocks holding data, where the format says it apart
        self.read = torch.zeros(max(1, b.n_stripes), dtype=torch.bool)
        self.per_window = max(1, PIECE // max(1, b.stripe_bytes))
        self.n_read = 0

    def stripes(self, wanted) -> None:
        """Read the stripes in ``wanted`` (int64 tensor) not read yet, runs of consecutive ones
        together, at most ``per_window`` stripes per window."""
        import torch

        s = torch.unique(wanted)
        s = s[~self.read[s]]
        if not s.numel():
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
        import torch

        self.stripes(torch.arange(self.b.n_stripes))

    def _window(self, first: int, count: int) -> None:
        import torch

        for got in self.q.handler.window(self.ck, self.q, first, count):
            idx, m = got[0], got[1]
            self.mags[idx] = m.to(self.mags.dtype)
            if len(got) > 2:
                if self.holds is None:
                    self.holds = torch.zeros(self.mags.numel(), dtype=torch.bool)
                self.holds[idx] = got[2]
        self.read[first: first + count] = True
        self.n_read += count


def check(ck: Checkpoint, q: QuantizedWeight) -> QuantizedScan:
    """Bad blocks, dequantized absmax and fp16/bf16 overflow of one quantized weight."""
    import torch

    b = q.handler.blocks(ck, q)
    s = b.values.reshape(-1).to(torch.float32)
    n = s.numel()
    out = QuantizedScan(q.name, q.format, q.scale, n)
    if b.stripe_of is not None and b.stripe_of.numel() != n:
        out.skipped = f"scale {q.scale} has {n} values for {b.stripe_of.numel()} blocks"
        return out
    nan, inf = torch.isnan(s), torch.isinf(s)
    zero, neg = s == 0, s < 0
    finite = ~(nan | inf)
    usable = finite & ~b.exclude if b.exclude is not None else finite
    r = _Reader(ck, q, b)
    reads = b.stripe_of is not None and b.n_stripes > 0
    limit = max(1, b.n_stripes // FULL_PASS_FRACTION)
    if reads and not b.zero_is_fault and bool(zero.any()):
        wanted = torch.unique(b.stripe_of[zero])
        if wanted.numel() > limit:
            r.everything()
        else:
            r.stripes(wanted)
    if reads:
        _absmax_candidates(r, torch.ones_like(s) if b.absolute else s.abs(), usable, b, limit)
    holds = r.holds if r.holds is not None else r.mags > 0
    bad = nan | inf | neg if b.negative_listed else nan | inf
    bad = bad | (zero if b.zero_is_fault else zero & holds)
    fault = nan | inf | (neg if b.negative_is_fault else torch.zeros_like(neg)) | (bad & zero)
    out.n_bad = int(bad.sum()) + len(b.extra_bad)
    out.n_faults = int(fault.sum()) + b.extra_faults
    out.bad_blocks = list(b.extra_bad)
    for i in bad.nonzero().reshape(-1)[:MAX_BAD_BLOCKS].tolist():
        v = float(s[i])
        problem = "nan" if v != v else "inf" if math.isinf(v) else "zero" if v == 0 else "negative"
        out.bad_blocks.append({"index": unravel(i, b.shape), "scale": "nan" if v != v else (
            "inf" if math.isinf(v) else v), "problem": problem})
    gm = abs(b.multiplier)
    known = usable & (r.mags >= 0)
    if bool(known.any()) and math.isfinite(gm):
        scaled = r.mags[known] if b.absolute else r.mags[known] * s[known].abs()
        out.dequant_absmax = float(scaled.max()) * gm
    if b.bound_only:
        bound = out.dequant_absmax
        out.dequant_absmax = None
        out.overflows = {"fp16": False if bound is not None and bound <= FP16_MAX else None,
                         "bf16": False if bound is not None and bound <= BF16_MAX else None}
    else:
        a = out.dequant_absmax
        out.overflows = {"fp16": bool(a is not None and a > FP16_MAX), "bf16": bool(a is not None and a > BF16_MAX)}
    out.stripes_read = r.n_read
    return out


def _absmax_candidates(r: _Reader, mag_s, finite, b: Blocks, limit: int) -> None:
    """Read stripes, largest possible contribution first, until no unread block can beat the
    largest known ``m * |scale|`` (or read them all when that is cheaper)."""
    import torch

    bound = b.bound if isinstance(b.bound, (int, float)) else b.bound.reshape(-1).to(torch.float32)
    upper = torch.where(finite, mag_s * bound, -1.0)
    k = 1
    while True:
        known = r.mags >= 0
        best = float((r.mags * mag_s).masked_fill(~(known & finite), -1.0).max()) if r.mags.numel() else -1.0
        open_ = upper.masked_fill(known, -1.0)
        top = float(open_.max()) if open_.numel() else -1.0
        if top < 0 or top <= best:
            return
        n_open = int((open_ > best).sum())
        cand = torch.topk(open_, min(k, n_open)).indices
        wanted = torch.unique(b.stripe_of[cand])
        before = r.n_read
        if before + wanted.numel() > limit:
            r.everything()
            return
        r.stripes(wanted)
        if r.n_read == before:  # nothing new to read (a window that left blocks out): stop
            return
        k *= 4
