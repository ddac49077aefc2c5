"""Recordings that never went to a file, as entries the one comparison takes
(``compare.compare_recordings``), so every comparison of two runs goes one way:

- ``from_outputs``: a model's floating outputs per input, tensors kept (``scan --compile``: the
  compiled run against eager, element by element, as ``kernels.compare`` has always judged it);
- ``from_calls``: a capture's module calls and stats rows (a watch's failing forward against its
  own re-run: ``first_nonfinite.reproducible``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..kernels.compare import flat
from ..trace.format import Stats


@dataclass(frozen=True)
class Recorded:
    """One entry of an in-memory recording (the attributes of ``trace.format.Entry`` it needs)."""

    index: int
    module: str
    module_type: str
    call_index: int
    input_index: int
    step: int
    stats: Stats
    dtype: str | None
    values: tuple[Any, ...] | None = None  # the tensors themselves, when kept
    phase: str = "forward"
    op: str | None = None
    spread: float | None = None
    producers: tuple[int | None, ...] | None = None
    input: Stats | None = None
    shape: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, int, int, int, str]:
        return self.module, self.call_index, self.input_index, self.step, self.phase


def _stats_of(tensors: list[Any]) -> tuple[Stats, str | None]:
    from ..trace.stats import combine, digest  # lazy: torch

    d = combine([digest(t, hash=False) for t in tensors])
    if d is None:
        return Stats(0, 0, 0, None, None, None, None, None), None
    return Stats(d.nan, d.posinf, d.neginf, d.absmax, d.absmin, d.mean, d.l2, None), d.dtype


def from_outputs(outputs: list[Any], module: str = "", module_type: str = "") -> list[Recorded]:
    """One entry per input: the floating tensors of ``outputs[i]`` (any nested output), kept."""

    out = []
    for i, o in enumerate(outputs):
        ts = flat(o)
        stats, dtype = _stats_of(ts)
        out.append(Recorded(i, module, module_type, 0, i, 0, stats, dtype, tuple(ts)))
    return out


def _row_stats(rows: Any, refs: list[tuple[str, int]]) -> Stats:
    """An entry's statistics from capture rows (``stats.TensorStats``): counts add, absmax is the
    max; mean and l2 only where every row has its sums."""
    rs = [rows[r] for _, r in refs]
    maxes = [r.absmax for r in rs if r.absmax is not None]
    mins = [r.min_nonzero for r in rs if r.min_nonzero is not None and math.isfinite(r.min_nonzero)]
    have_sums = bool(rs) and all(r.sum is not None and r.sumsq is not None for r in rs)
    n = sum(r.numel - r.nan - r.posinf - r.neginf for r in rs)
    mean = sum(r.sum for r in rs) / n if have_sums and n else None
    l2 = math.sqrt(sum(r.sumsq for r in rs)) if have_sums else None
    return Stats(
        sum(r.nan for r in rs),
        sum(r.posinf for r in rs),
        sum(r.neginf for r in rs),
        max(maxes) if maxes else None,
        min(mins) if mins else None,
        mean,
        l2,
        None,
    )


def from_calls(calls: list[Any], rows: Any) -> list[Recorded]:
    """The forward calls of a capture (``capture.records.Call``) that finished, in completion
    order, with the statistics of their outputs."""
    done = sorted(
        (c for c in calls if c.phase == "forward" and c.seq >= 0 and c.outputs), key=lambda c: c.seq
    )
    return [
        Recorded(
            i, c.module, c.module_type, c.call_index, c.input_index, 0, _row_stats(rows, c.outputs), None
        )
        for i, c in enumerate(done)
    ]
