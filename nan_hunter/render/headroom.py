"""The headroom strip as data: one row per module call (execution order) with where its output
absmax sits between ``FLOOR`` and the run's largest finite value on a log scale, and how much
headroom is left. Each view draws it its own way (terminal bar, HTML bar, Markdown cell)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..dtypes import HEADROOM_DTYPES
from ..report import Report
from .rows import Row, call_name, fmt, is_bad, kind_of, producer_index, range_dtype, range_max

FLOOR = 1e-4  # the bar starts here: smaller outputs have more headroom than anything can use
CONTEXT = 4  # calls shown before the producer however small they are
STRIP_ROWS = 40  # calls shown at most; the rest collapse into "⋮ N calls" lines


@dataclass(frozen=True)
class StripCall:
    module: str  # raw name, "<root>" for the root
    module_type: str
    depth: int
    input_index: int | None  # set when the report has several inputs
    producer: bool
    absmax: str  # formatted; "NaN", "+inf" or "−inf" for a non-finite output
    headroom: str  # "328x", "∞", "—"
    fill: float  # 0..1: position of log10(absmax) between FLOOR and the max
    tone: str  # bad (non-finite) | tight (≥ 50% of max) | close (≥ 1%) | ok | empty (absmax 0)
    absmin: str = "—"  # smallest non-zero |out|, with its share of subnormals in its own dtype
    flush: str = "—"  # share of outputs a cast to ``Strip.flush_dtype`` rounds to zero: "0", "<0.1%", "12%"


@dataclass(frozen=True)
class StripGap:
    calls: int
    absmax_le: float | None  # largest absmax among the hidden calls; None for the trailing gap

    @property
    def text(self) -> str:
        if self.absmax_le is None:
            return f"⋮ {self.calls} more call(s)"
        return f"⋮ {self.calls} call(s), absmax ≤ {self.absmax_le:.3g}"


@dataclass(frozen=True)
class Strip:
    run_dtype: str
    dtype: str  # the dtype bounding the run's activations (bf16 for an fp8 run)
    max: float  # its largest finite value: the bars climb to it
    calls: int
    items: list[StripCall | StripGap]
    flush_dtype: str = "fp16"  # the dtype whose flush-to-zero ``StripCall.flush`` measures (``flush_dtype``)

    @property
    def has_absmin(self) -> bool:
        """Whether any call's abs-min was measured (a --generate run measures none): the views
        leave the column out rather than show a dash on every row."""
        return any(isinstance(it, StripCall) and it.absmin != "—" for it in self.items)

    @property
    def title(self) -> str:
        where = (
            self.dtype
            if self.dtype == self.run_dtype
            else f"{self.run_dtype} run, activations in {self.dtype}"
        )
        return f"headroom per module call ({self.calls} calls, {where} max {self.max:.6g}; bar from {FLOOR:g} to the max)"


def fraction(row: Row, mx: float) -> float:
    """absmax / max; inf for a non-finite output (it has no headroom at all)."""
    return math.inf if is_bad(row) else (row["absmax"] or 0.0) / mx


def pick_rows(rows: Sequence[Row], mx: float, producer: int | None, max_rows: int) -> list[int]:
    """Indices to show, in execution order: the producer with the few calls that led to it, then
    the tightest calls."""
    if len(rows) <= max_rows:
        return list(range(len(rows)))
    keep: set[int] = set()
    if producer is not None:
        keep.update(range(max(0, producer - CONTEXT), producer + 1))
    for i in sorted(range(len(rows)), key=lambda i: fraction(rows[i], mx), reverse=True):
        if len(keep) >= max_rows:
            break
        keep.add(i)
    return sorted(keep)


def flush_dtype(compute: str) -> str:
    """The dtype whose flush-to-zero the strip shows: what the run computes in (fp32 outputs under
    autocast, norms and losses, are cast down to it), fp16 for an fp32 run (the 16-bit dtype with
    the least range below 1)."""

    return compute if compute in HEADROOM_DTYPES else "fp16"


def flush_text(row: Row, dtype: str) -> str:
    """The share of a call's outputs that a cast to ``dtype`` rounds to zero (non-zero before):
    "—" when not measured, "0" when none."""
    f = (row.get("flush_frac") or {}).get(dtype)
    if f is None:
        return "—"
    if f == 0:
        return "0"
    return "<0.1%" if f < 0.001 else f"{f:.1%}" if f < 0.1 else f"{f:.0%}"


def _call(row: Row, mx: float, producer: bool, multi: bool, flush: str) -> StripCall:
    kind = kind_of(row)
    a = row["absmax"]
    frac = fraction(row, mx)
    if kind is not None:
        fill, tone, absmax, head = 1.0, "bad", kind, "—"
    elif not a:
        fill, tone, absmax, head = 0.0, "empty", fmt(a) if a is not None else "—", "∞"
    else:
        lo, hi = math.log10(FLOOR), math.log10(mx)
        fill = min(1.0, max(0.0, (math.log10(a) - lo) / (hi - lo)))
        tone = "tight" if frac >= 0.5 else "close" if frac >= 0.01 else "ok"
        absmax, head = fmt(a), f"{1 / frac:.3g}x"
    return StripCall(
        call_name(row),
        row["module_type"],
        int(row.get("depth", 0)),
        row["input_index"] if multi else None,
        producer,
        absmax,
        head,
        fill,
        tone,
        absmin_text(row),
        flush_text(row, flush),
    )


def absmin_text(row: Row) -> str:
    """The smallest non-zero |out| (abs-min), with its share of subnormal values when any."""
    m = row.get("min_nonzero")
    if m is None:
        return "—"
    sub = row.get("subnormal_frac")
    return fmt(m) + (f" ({sub:.0%} sub)" if sub else "")


def strip(rep: Report, max_rows: int = STRIP_ROWS) -> Strip | None:
    """The strip of ``rep.modules``: at most ``max_rows`` calls, the rest as gaps; None without
    module rows."""
    rows = rep.modules or []
    if not rows:
        return None
    run_dtype = rep.run_fact("dtype") or "fp32"
    dt = rep.run_fact("compute_dtype") or range_dtype(run_dtype)  # fp8.compute: fp32 is recorded
    mx = range_max(dt)
    flush = flush_dtype(dt)
    prod = producer_index(rep)
    multi = len({r["input_index"] for r in rows}) > 1
    items: list[StripCall | StripGap] = []
    prev = -1
    for i in pick_rows(rows, mx, prod, max_rows):
        if i - prev > 1:
            items.append(
                StripGap(i - prev - 1, max((r["absmax"] or 0.0 for r in rows[prev + 1 : i]), default=0.0))
            )
        items.append(_call(rows[i], mx, i == prod, multi, flush))
        prev = i
    if prev < len(rows) - 1:
        items.append(StripGap(len(rows) - 1 - prev, None))
    return Strip(run_dtype, dt, mx, len(rows), items, flush)
