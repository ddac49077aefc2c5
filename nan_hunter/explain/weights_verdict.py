"""The weights scan's part of a report, made without torch (a weights-only ``scan``/``check`` never
imports it): the report's ``weights`` block (``weights_section``) and, for a run that never ran the
model or found nothing, the verdict of the weights alone (``weights_verdict``): non-finite weights,
else corrupt quantization scales. The rest of the assembler is ``explain.assemble``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..dtypes import HEADROOM_DTYPES, limits
from ..load.quant.base import severity
from ..load.weights_sections import bad_scales, weights_sections
from ..report import Diagnosis, Report
from .diagnose import Evidence, diagnose

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..load.weights import WeightsScan


def weights_section(ws: WeightsScan, cfg: Config) -> dict[str, Any]:
    """The report's ``weights`` block (contract v1 keys, plus the scan's extensions)."""
    frac = cfg.weights.near_overflow_fraction
    near = []
    for t in ws.tensors:
        # a quantized weight's scales, zero points and codes are not values a run computes with (fp8 codes
        # reach 448 by design): the weight is listed below by its dequantized values
        if t.skipped or not t.finite or t.name in ws.claimed:
            continue
        tight = {d: h for d, h in t.headroom.items() if h < 1 / frac}
        if tight:
            near.append(
                {
                    "name": t.name,
                    "dtype": t.dtype,
                    "absmax": t.absmax,
                    "overflows": [d for d, o in t.overflows.items() if o],
                    "headroom": tight,
                }
            )
    for q in ws.quantized:
        if q.dequant_absmax is None:
            continue
        room = {
            d: (limits(d).max / q.dequant_absmax if q.dequant_absmax else math.inf) for d in HEADROOM_DTYPES
        }
        tight = {d: h for d, h in room.items() if h < 1 / frac}
        if tight:
            near.append(
                {
                    "name": q.name,
                    "dtype": q.format,
                    "absmax": q.dequant_absmax,
                    "dequantized": True,
                    "overflows": [d for d, h in room.items() if h < 1],
                    "headroom": tight,
                }
            )
    sampled = any(t.sampled for t in ws.tensors)
    under = [t for t in ws.tensors if (t.fp16_zero_frac or 0) > 0.01]
    return {
        "n_tensors": ws.n_tensors,
        "nonfinite": [t.nonfinite_dict() for t in ws.nonfinite],
        "n_skipped": ws.n_skipped,
        "near_overflow": near,
        "fp16_underflow": [
            {
                "name": t.name,
                "zero_frac": t.fp16_zero_frac,
                "subnormal_frac": t.fp16_subnormal_frac,
                "min_nonzero": t.min_nonzero,
            }
            for t in under
        ],
        "underflow_sampled": sampled,
        "tensors": [t.to_dict() for t in ws.tensors],
        **weights_sections(ws),  # unchecked, quantized, suspicious
    }


def weights_verdict(
    rep: Report, cfg: Config, ws: WeightsScan | None = None, scales_only: bool = False
) -> None:
    """``rep.diagnosis`` from the weights scan alone, for a run that never ran the model or found
    nothing; None when the weights are clean. The cause is per tensor: a float tensor holding NaN/Inf is
    ``nonfinite_weights``, a quantized weight's bad scale is ``bad_scale`` (its scale tensor's own NaN/Inf
    too); when both exist both are named and the headline is the first in checkpoint order. Among bad
    scales the worst leads (NaN/Inf before a zero, before a negative), then checkpoint order.
    ``scales_only``: the model ran and stayed finite, so only corrupt scales are still a fault (a
    non-finite weight it never read is not)."""
    scales = bad_scales(ws) if ws is not None else []
    own = {q["scale"] for q in scales}
    bad = (
        [] if scales_only else [w for w in (rep.weights or {}).get("nonfinite") or [] if w["name"] not in own]
    )
    if not bad and not scales:
        rep.diagnosis = None
        return
    pos = {t.name: i for i, t in enumerate(ws.tensors)} if ws is not None else {}
    end = len(pos)

    def where(q: dict[str, Any]) -> int:
        return min(pos.get(q["name"], end), pos.get(q["scale"], end))

    scales.sort(key=lambda q: (severity(q), where(q)))
    made: list[tuple[int, Diagnosis | None, str]] = []
    if bad:
        made.append((pos.get(bad[0]["name"], end), _diagnose(cfg, bad, []), bad[0]["name"]))
    if scales:
        made.append((min(where(q) for q in scales), _diagnose(cfg, [], scales), scales[0]["name"]))
    found = [(p, d, name) for p, d, name in made if d is not None]
    if not found:
        rep.diagnosis = None
        return
    found.sort(key=lambda x: x[0])  # stable: nonfinite weights first at a tie
    head = found[0][1]
    head.param = head.param or found[0][2]  # the tensor the headline names (the verdict line shows it)
    for _, other, _ in found[1:]:
        head.evidence = [*head.evidence, f"also ({other.cause}): {other.summary}", *other.evidence]
        head.fix = f"{head.fix} Also: {other.fix}"
    rep.diagnosis = head


def _diagnose(cfg: Config, nonfinite: list[dict[str, Any]], scales: list[dict[str, Any]]) -> Diagnosis | None:
    return diagnose(
        Evidence(
            role=None,
            kind=None,
            module=None,
            module_type=None,
            op=None,
            weights_nonfinite=nonfinite,
            config=cfg.diagnosis,
            bad_scales=scales,
        )
    )
