"""load/quant/awq.py: AutoAWQ's packing — GEMM words hold 8 outputs in the order 0, 2, 4, 6, 1, 3, 5,
7, GEMV words 8 inputs in natural order; layouts that are not AWQ's, or AWQ that is not 4-bit
GEMM/GEMV, are unchecked with the reason. (Against AutoAWQ's own dequantization: test_gptq_awq.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.quant.awq import AWQ_ORDER, AWQ_REVERSE_ORDER, Awq, awq_columns, unpack_nibbles

from .kit import detect, graded

DATA = Path(__file__).resolve().parents[3] / "data" / "quant"
EXPECTED = json.loads((DATA / "expected.json").read_text())


def _word(nibbles: list[int]) -> int:
    v = sum(c << (4 * k) for k, c in enumerate(nibbles))
    return v - (1 << 32) if v >= 1 << 31 else v


def test_the_two_orders_are_inverses():
    assert [AWQ_ORDER[AWQ_REVERSE_ORDER[p]] for p in range(8)] == list(range(8))


def test_unpack_nibbles_in_slot_order():
    w = np.array([[_word([1, 2, 3, 4, 5, 6, 7, 15])]], dtype=np.int32)
    assert unpack_nibbles(w).tolist() == [
        [[1, 2, 3, 4, 5, 6, 7, 15]]
    ]  # 15 in the top slot: not sign-extended


def test_gemm_words_give_output_columns():
    # slot k holds output AWQ_ORDER[k]: write output p's code p + 1 into its slot
    slots = [0] * 8
    for p in range(8):
        slots[AWQ_REVERSE_ORDER[p]] = p + 1
    assert awq_columns(np.array([[_word(slots)]], dtype=np.int32)).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]


@pytest.mark.parametrize("case", ["awq_gemm", "awq_gemv"])
def test_library_checkpoints(tmp_path, case):
    d = tmp_path / case
    shutil.copytree(DATA / case, d)
    (r,) = graded(Awq(), open_checkpoint(d)).values()
    assert r.format == "awq" and r.bad_blocks == []
    assert r.dequant_absmax == pytest.approx(EXPECTED[case]["dequant_absmax"], rel=2e-3)


@pytest.mark.parametrize(
    "change, why",
    [
        ({"version": "exllama"}, "AWQ version 'exllama' packs differently"),
        ({"bits": 3}, "3-bit AWQ (AutoAWQ writes 4-bit only)"),
    ],
)
def test_what_is_not_read_is_said(tmp_path, change, why):
    d = tmp_path / "awq_gemm"
    shutil.copytree(DATA / "awq_gemm", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (d / "config.json").write_text(json.dumps(cfg))
    found, ctx = detect(Awq(), open_checkpoint(d))
    assert found == {} and ctx.unchecked and ctx.unchecked[0]["reason"].startswith(why)


def test_another_methods_checkpoint_is_not_awqs(tmp_path):
    d = tmp_path / "gptq"
    shutil.copytree(DATA / "gptq_4bit_sym_v2", d)
    assert detect(Awq(), open_checkpoint(d))[0] == {}
