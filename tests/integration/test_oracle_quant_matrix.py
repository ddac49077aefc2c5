"""``check`` on quantized checkpoints held against the quantized oracle (``tests/oracle/quant.py``, which
shares no code with nanhunter): format (fp8 block, channel and tensor scales, int8 groups, NVFP4, MXFP4, GGUF Q8_0/Q4_0,
bitsandbytes nf4/fp4/int8) × fault (NaN/Inf/zero scale, NaN code, overflow past fp16 or bf16 after dequantization, a plain float tensor
holding −inf, none) × check dtype (fp16, bf16). Each checkpoint is dequantized by its format's own
library (compressed-tensors, gguf-py, bitsandbytes); in every cell ``check``'s verdict, the weight's
``overflows[dtype]``, ``dequant_nonfinite`` and ``dequant_absmax`` must agree with what those values imply.
``dequant_nonfinite`` and ``dequant_absmax`` may be null where nanhunter says it cannot count (the
dequantization itself overflowing float32); then the verdict must still agree. GPTQ and AWQ: the
committed fixtures written by their reference packers (``tests/data/quant``), clean, against the
packers' own dequantized absmax (``expected.json``).

The default slice checks every (format, fault) pair in one dtype (alternating); the full product is
marked ``matrix_full`` and runs with ``NANHUNTER_FULL_MATRIX=1``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("bitsandbytes")
pytest.importorskip("compressed_tensors")

from oracle.quant import FORMATS, build  # noqa: E402  (tests/ is on sys.path)

from nan_hunter.pipeline.ci_check import check  # noqa: E402

FULL = os.environ.get("NANHUNTER_FULL_MATRIX") == "1"
DTYPES = ("fp16", "bf16")
ROOT = Path(__file__).resolve().parents[2]


def _cells():
    k = 0
    for fmt, faults in FORMATS.items():
        for fault in faults:
            for j, dt in enumerate(DTYPES):
                if j == k % len(DTYPES):
                    yield pytest.param(fmt, fault, dt, id=f"{fmt}-{fault}-{dt}")
                else:
                    yield pytest.param(
                        fmt,
                        fault,
                        dt,
                        id=f"{fmt}-{fault}-{dt}",
                        marks=[
                            pytest.mark.matrix_full,
                            pytest.mark.skipif(not FULL, reason="full matrix: NANHUNTER_FULL_MATRIX=1"),
                        ],
                    )
            k += 1


@pytest.mark.parametrize("fmt, fault, dtype", list(_cells()))
def test_check_agrees_with_the_libraries_dequantization(fmt, fault, dtype, tmp_path):
    case = build(fmt, fault, tmp_path / "ck")
    (rep,) = check(str(case.path), dtypes=dtype)
    q = next(x for x in rep.weights["quantized"] if x["name"] == case.weight)
    assert rep.check["passed"] is case.passes(dtype), rep.check["results"]
    assert q["overflows"][dtype] is case.overflows(dtype)
    if q["dequant_nonfinite"] is None:  # not counted: only where the dequantization overflowed float32
        assert q["dequant_absmax"] is None and case.nonfinite and not q["bad_blocks"]
        return
    assert q["dequant_nonfinite"] == case.nonfinite
    if case.absmax is None:
        assert q["dequant_absmax"] is None
    else:
        # nvfp4: compressed-tensors rounds scale / global scale on its way (299008 where the exact product is
        # 300000, 0.3 %): the verdicts agree, the magnitude within 1 %
        assert q["dequant_absmax"] == pytest.approx(case.absmax, rel=1e-2 if fmt == "nvfp4" else 1e-5)


@pytest.mark.parametrize(
    "fixture", sorted(p.name for p in (ROOT / "tests" / "data" / "quant").iterdir() if p.is_dir())
)
def test_gptq_and_awq_fixtures_agree_with_their_packers(fixture):
    expected = json.loads((ROOT / "tests" / "data" / "quant" / "expected.json").read_text())[fixture]
    (rep,) = check(str(ROOT / "tests" / "data" / "quant" / fixture), dtypes="fp16,bf16")
    (q,) = rep.weights["quantized"]
    assert rep.check["passed"] and q["dequant_nonfinite"] == 0
    assert q["dequant_absmax"] == pytest.approx(expected["dequant_absmax"], rel=1e-3)
    assert q["overflows"] == {"fp16": False, "bf16": False}
