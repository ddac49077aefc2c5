"""The weights scan, now numpy on the memory map, reports what the torch path it replaced reported:
``tests/data/weights_reference.json`` holds the report's ``weights`` block of every committed fixture
(``examples/``, ``tests/data/quant/`` GPTQ and AWQ, ``tests/data/dtypes/edge_cases.safetensors`` with
every safetensors dtype), fast and ``--stats full``, written by the torch path (commit d6e40c4, with
``tests/parity/scan_fixtures.py --write``). Field by field, they must be equal.

One difference is deliberate and asserted as such: the torch path rounded the absmax of an F64 tensor
holding NaN/Inf through float32 (so 1.8e308 became inf, reported null with headroom 0, also in
``suspicious``); numpy keeps it exact. (``tests/parity`` also compares every scan the load, fuzz, quantized and CLI tests run, before
and after, by the bytes scanned.)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from nan_hunter.dtypes import limits

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "parity"))
from scan_fixtures import fixtures, weights_blocks  # noqa: E402

REFERENCE = json.loads((ROOT / "tests" / "data" / "weights_reference.json").read_text(encoding="utf-8"))
#: (fixture, tensor) whose absmax the torch path rounded through float32 (F64 beside NaN/Inf)
F64_ROUNDED = {("tests/data/dtypes/edge_cases.safetensors", "float.F64.edges")}


def _fixed(fixture: str, level: str, ref: dict, got: dict) -> dict:
    """``ref`` with the F64 absmax the torch path lost put back, after checking that it is the only change;
    and contract v1.4's ``quantized[].dequant_nonfinite`` added (these fixtures' scales are all finite: 0)."""
    if "tensors" not in ref:
        return ref
    ref = json.loads(json.dumps(ref))
    for q in ref.get("quantized") or []:
        assert "dequant_nonfinite" not in q
        q["dequant_nonfinite"] = 0
    for t_ref, t_got in zip(ref["tensors"], got["tensors"]):
        if (fixture, t_ref["name"]) not in F64_ROUNDED:
            continue
        assert t_ref["absmax"] is None and t_ref["headroom"] == {k: 0.0 for k in t_ref["headroom"]}, level
        assert t_got["dtype"] == "float64" and t_got["nan"] and t_got["absmax"] == 1.7976931348623157e308
        t_ref["absmax"] = t_got["absmax"]
        t_ref["headroom"] = {k: limits(k).max / t_got["absmax"] for k in t_ref["headroom"]}
        for row in ref["suspicious"]:  # "huge": listed by both, with the absmax each had
            if row["name"] == t_ref["name"]:
                assert row["absmax"] is None and row["reason"] == "huge"
                row["absmax"] = t_got["absmax"]
    return ref


def test_every_fixture_has_a_reference():
    assert sorted(str(p.relative_to(ROOT)) for p in fixtures()) == sorted(REFERENCE)


@pytest.mark.parametrize("fixture", sorted(REFERENCE))
def test_weights_block_equals_the_torch_path(fixture):
    got = json.loads(json.dumps(weights_blocks(ROOT / fixture)))
    for level in ("fast", "full"):
        ref = _fixed(fixture, level, REFERENCE[fixture][level], got[level])
        assert got[level] == ref, (fixture, level, _first_difference(ref, got[level]))


def _first_difference(a, b, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k, math.nan) != b.get(k, math.nan):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} != {b!r}"
