"""The sections of the report's ``weights`` block that go beyond the per-tensor rows:
``unchecked`` (tensors that could hold NaN/Inf but were not checked), ``quantized`` (quantized
weights with their scales, from ``quantized``) and ``suspicious`` (uninitialised memory, all-zero
weight matrices). Format-neutral dicts, as the contract gives them."""

from __future__ import annotations

from typing import Any

from .weights import WeightsScan

HUGE = 1e30  # |x| above this in a float tensor: uninitialised memory, not a trained weight


def suspicious(ws: WeightsScan) -> list[dict[str, Any]]:
    """``weights.suspicious``: finite tensors with |x| > 1e30, and weight matrices (≥ 2 dims)
    that are entirely zero (not quantization scales: those are judged block by block). Both
    follow from the absmax the scan already has."""
    out = []
    # scales, zero points and quant states are judged per block (``quant``), not as weight matrices
    scales = {q.scale for q in ws.quantized} | ws.claimed
    for t in ws.tensors:
        if t.skipped or t.absmax is None or t.name in scales:
            continue
        if t.absmax > HUGE:
            out.append({"name": t.name, "reason": "huge", "absmax": t.absmax})
        elif t.absmax == 0 and len(t.shape) >= 2 and t.finite:
            out.append({"name": t.name, "reason": "all_zero", "absmax": 0.0})
    return out


def bad_scales(ws: WeightsScan) -> list[dict[str, Any]]:
    """Quantized weights with a fault (a NaN/Inf scale, or a zero scale on a block holding data)."""
    return [q.to_dict() for q in ws.quantized if q.faulty]


def weights_sections(ws: WeightsScan) -> dict[str, Any]:
    return {
        "unchecked": ws.unchecked,
        "quantized": [q.to_dict() for q in ws.quantized],
        "suspicious": suspicious(ws),
    }
