"""Per-tensor statistics as plain Python data (no torch), shared by scan, capture and report.

A stats *row* is what the kernels write: ``INT_FIELDS`` as int64 and ``FLOAT_FIELDS`` as
float32, one row per measured tensor. Fields a fast path did not compute hold -1 (ints)
or NaN (floats) and read back as ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..dtypes import HEADROOM_DTYPES, canonical
from ..errors import BadInput
from ..options import StatsLevel, choice

INT_FIELDS: tuple[str, ...] = (
    "numel",
    "nan",
    "posinf",
    "neginf",
    "zero",
    "subnormal",  # 0 < |x| < smallest normal of the tensor's own dtype
    "over_fp16",  # finite and |x| > 65504
    "over_bf16",
    "over_e4m3",  # finite and |x| > 448
    "over_e5m2",  # finite and |x| > 57344
    "under_fp16",  # finite, 0 < |x| <= 2^-25: rounds to zero when cast to fp16
    "under_bf16",  # finite, 0 < |x| <= 2^-134
    "under_e4m3",  # finite, 0 < |x| <= 2^-10
    "under_e5m2",  # finite, 0 < |x| <= 2^-17
    "first_nonfinite",  # flat (row-major) index of the first NaN/±Inf, -1 if none
)
FLOAT_FIELDS: tuple[str, ...] = (
    "absmax",  # over finite values; 0.0 when none
    "min_nonzero",  # smallest non-zero |x| over finite values; inf when none
    "sum",  # over finite values, fp32 accumulation
    "sumsq",
)
N_INT = len(INT_FIELDS)
N_FLOAT = len(FLOAT_FIELDS)

#: one per ``dtypes.HEADROOM_DTYPES`` target, in that order: ``over_*`` counts finite values above
#: the target's max, ``under_*`` non-zero values that round to zero when cast to it
#: (``dtypes.Limits.flush``)
OVER_FIELDS: tuple[str, ...] = ("over_fp16", "over_bf16", "over_e4m3", "over_e5m2")
UNDER_FIELDS: tuple[str, ...] = ("under_fp16", "under_bf16", "under_e4m3", "under_e5m2")


@dataclass
class TensorStats:
    numel: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zero: int | None = None
    subnormal: int | None = None
    over_fp16: int | None = None
    over_bf16: int | None = None
    over_e4m3: int | None = None
    over_e5m2: int | None = None
    under_fp16: int | None = None
    under_bf16: int | None = None
    under_e4m3: int | None = None
    under_e5m2: int | None = None
    first_nonfinite: int | None = None
    absmax: float | None = None
    min_nonzero: float | None = None
    sum: float | None = None
    sumsq: float | None = None

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.posinf == 0 and self.neginf == 0

    @property
    def kind(self) -> str | None:
        """The kind of the first non-finite value class present, by severity: nan, posinf, neginf."""
        if self.nan:
            return "nan"
        if self.posinf:
            return "posinf"
        if self.neginf:
            return "neginf"
        return None

    @property
    def mean(self) -> float | None:
        if self.sum is None or not self.numel:
            return None
        n = self.numel - self.nan - self.posinf - self.neginf
        return self.sum / n if n else None

    def flushed(self, target: str) -> int | None:
        """How many non-zero finite values become zero when cast to ``target`` (one of
        ``dtypes.HEADROOM_DTYPES``), or None when the row did not count them."""

        flushed: int | None = getattr(self, UNDER_FIELDS[HEADROOM_DTYPES.index(canonical(target))])
        return flushed

    @classmethod
    def from_row(cls, ints: list[int], floats: list[float]) -> TensorStats:
        kw: dict[str, Any] = {}
        for name, v in zip(INT_FIELDS, ints):
            kw[name] = None if v < 0 and name not in ("numel",) else int(v)
        for name, f in zip(FLOAT_FIELDS, floats):
            kw[name] = None if math.isnan(f) else float(f)
        # counts that are always computed
        for name in ("nan", "posinf", "neginf"):
            kw[name] = kw[name] or 0
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("absmax", "min_nonzero", "sum", "sumsq"):
            v = out[k]
            if v is not None and math.isinf(v):
                out[k] = None
        return out


#: ``--stats``: fast (underflow statistics from a sample of each large tensor) or full (exact)
STATS_LEVELS = tuple(m.value for m in StatsLevel)  # "fast", "full"


def parse_stats_level(value: str) -> str:
    """``--stats`` / ``stats=`` checked, for scan and check alike: exit 2 (BadInput) naming the choices."""
    level = choice(StatsLevel, value, f"--stats {value!r}: use fast or full")
    if level is None:
        raise BadInput(f"--stats {value!r}: use fast or full")
    return level
