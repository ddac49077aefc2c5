"""The overflow forecast (report field ``forecast``): for each sampled signal whose level rises by
more than noise, its headroom to each dtype's largest finite value, how fast that headroom shrinks
and the step at which the fitted line crosses it.

A signal's level in dB: ``absmax`` and ``attention_logits`` are magnitudes (``20·log10(v)``);
``output_logsumexp`` is ``|log Z|``, the exponent of the softmax normaliser ``Z = Σ exp(logit)``,
whose level is that of ``Z`` itself (``20·|log Z|/ln 10``): the margin before an unshifted
``exp``/sum in that dtype overflows."""

from __future__ import annotations

import math
from typing import Any

from ..capture.signals import LOGSUMEXP, Signals
from ..dtypes import canonical, limits
from .fit import fit, level_db

_DB_PER_NEPER = 20.0 / math.log(10.0)


def signal_level(signal: str, value: float) -> float:
    """A sampled value's level in dB (module docstring)."""
    return value * _DB_PER_NEPER if signal == LOGSUMEXP else level_db(value)


def forecast(
    signals: Signals | None, run_dtype: str | None, targets: tuple[str, ...], window: int
) -> list[dict[str, Any]] | None:
    """Contract v1.4 ``forecast``: one entry per (module, signal, dtype) whose headroom shrinks,
    soonest crossing first (unprojected entries last, least headroom first). None when no step was
    sampled; an empty list when nothing shrinks. ``run_dtype``: the run's precision (None: fp32)."""
    if signals is None or not signals.steps:
        return None
    dtypes: list[str] = []
    for d in (run_dtype or "fp32", *targets):
        d = canonical(d)
        if d not in dtypes:
            dtypes.append(d)
    out: list[dict[str, Any]] = []
    for (module, signal), pts in signals.series.items():
        trend = fit([(s, signal_level(signal, v)) for s, v in pts[-window:]] if window > 0 else [])
        if trend is None or not trend.rising:
            continue
        for d in dtypes:
            top = level_db(limits(d).max)
            out.append(
                {
                    "module": module,
                    "signal": signal,
                    "dtype": d,
                    "headroom_db": round(top - trend.last_level, 2),
                    "rate_db_per_100_steps": round(-100.0 * trend.slope, 3),
                    "projected_step": trend.crossing(top),
                    "confidence": trend.confidence_at(trend.projection(top)),
                }
            )
    out.sort(key=lambda e: (e["projected_step"] is None, e["projected_step"] or 0, e["headroom_db"]))
    return out
