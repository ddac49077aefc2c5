"""The weights scan's part of a report, made without torch (a weights-only ``scan``/``check`` never
imports it): the report's ``weights`` block (``weights_section``) and, for a run that never ran the
model or found nothing, the verdict of the weights alone (``weights_verdict``): non-finite weights,
else corrupt quantization scales. The rest of the assembler is ``explain.assemble``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..load.weights_sections import bad_scales, weights_sections
from ..report import Report
from .diagnose import Evidence, diagnose

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..load.weights import WeightsScan


def weights_section(ws: WeightsScan, cfg: Config) -> dict[str, Any]:
    """The report's ``weights`` block (contract v1 keys, plus the scan's extensions)."""
    frac = cfg.weights.near_overflow_fraction
    near = []
    for t in ws.tensors:
        if t.skipped or not t.finite:
            continue
        tight = {d: h for d, h in t.headroom.items() if h < 1 / frac}
        if tight:
            near.append({"name": t.name, "dtype": t.dtype, "absmax": t.absmax,
                         "overflows": [d for d, o in t.overflows.items() if o], "headroom": tight})
    sampled = any(t.sampled for t in ws.tensors)
    under = [t for t in ws.tensors if (t.fp16_zero_frac or 0) > 0.01]
    return {
        "n_tensors": ws.n_tensors,
        "nonfinite": [t.nonfinite_dict() for t in ws.nonfinite],
        "n_skipped": ws.n_skipped,
        "near_overflow": near,
        "fp16_underflow": [{"name": t.name, "zero_frac": t.fp16_zero_frac, "subnormal_frac": t.fp16_subnormal_frac,
                            "min_nonzero": t.min_nonzero} for t in under],
        "underflow_sampled": sampled,
        "tensors": [t.to_dict() for t in ws.tensors],
        **weights_sections(ws),  # unchecked, quantized, suspicious
    }


def weights_verdict(rep: Report, cfg: Config, ws: WeightsScan | None = None, scales_only: bool = False) -> None:
    """``rep.diagnosis`` from the weights scan alone, for a run that never ran the model or found
    nothing: non-finite weights (``nonfinite_weights``), else bad quantization scales
    (``bad_scale``); None when the weights are clean. ``scales_only``: the model ran and stayed
    finite, so only corrupt scales are still a fault (a non-finite weight it never read is not)."""
    bad = [] if scales_only else (rep.weights or {}).get("nonfinite") or []
    scales = bad_scales(ws) if ws is not None else []
    rep.diagnosis = None if not bad and not scales else diagnose(Evidence(
        role=None, kind=None, module=None, module_type=None, op=None, weights_nonfinite=bad, config=cfg.diagnosis,
        bad_scales=scales))
