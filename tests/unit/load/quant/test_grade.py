"""load/quant/grade.py: one quantized weight judged from its scales — NaN/Inf scales bad whatever the
block holds, a zero scale bad only on a block holding data (or always, where the format says so),
a negative one listed and a fault only where the format says, the dequantized absmax over usable
blocks times the global scale, fp16/bf16 overflow, the list capped; and the same answer whether a few
stripes or every stripe is read."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.load.quant import grade
from nan_hunter.load.quant.base import MAX_BAD_BLOCKS
from nan_hunter.load.quant.fp8 import Fp8
from nan_hunter.load.quant.scales import StandaloneScales

from .kit import checkpoint, detect

E4M3 = torch.float8_e4m3fn


def _fp8(tmp_path, w: torch.Tensor, s: torch.Tensor):
    ck = checkpoint(
        tmp_path,
        {"l.weight": w.to(E4M3), "l.weight_scale_inv": s},
        {"quant_method": "fp8", "weight_block_size": [2, 2]},
    )
    (q,) = detect(Fp8(), ck)[0].values()
    return ck, q


def test_each_problem_per_block(tmp_path):
    w = torch.ones(4, 4)
    w[:2, 2:] = 0.0  # block (0, 1) holds no data
    s = torch.tensor([[math.nan, 0.0], [0.0, -2.0]])
    r = grade.check(*_fp8(tmp_path, w, s))
    assert r.bad_blocks == [
        {"index": [0, 0], "scale": "nan", "problem": "nan"},
        {"index": [1, 0], "scale": 0.0, "problem": "zero"},  # (0, 1) is empty: fine
        {"index": [1, 1], "scale": -2.0, "problem": "negative"},
    ]
    assert (r.n_bad, r.n_faults) == (3, 2)  # a negative weight scale is listed, not a fault
    assert r.dequant_absmax == 2.0  # |1 * -2|: the NaN block left out


@pytest.mark.parametrize(
    "scale, absmax, fp16, bf16", [(1.0, 448.0, False, False), (200.0, 89600.0, True, False)]
)
def test_overflow_of_fp16_and_bf16(tmp_path, scale, absmax, fp16, bf16):
    r = grade.check(*_fp8(tmp_path, torch.full((2, 2), 448.0), torch.tensor([[scale]])))
    assert r.dequant_absmax == absmax and r.overflows == {"fp16": fp16, "bf16": bf16}


def test_every_scale_bad_leaves_no_absmax(tmp_path):
    r = grade.check(*_fp8(tmp_path, torch.ones(2, 2), torch.tensor([[math.inf]])))
    # contract v1.4: every value is non-finite after dequantization (0 x inf is NaN too), so no finite
    # absmax, and the tensor overflows every dtype
    assert r.dequant_absmax is None and r.overflows == {"fp16": True, "bf16": True} and r.faulty
    assert r.dequant_nonfinite == 4


def test_the_list_is_capped_the_count_is_not(tmp_path):
    n = MAX_BAD_BLOCKS + 5
    r = grade.check(*_fp8(tmp_path, torch.ones(2, 2 * n), torch.full((1, n), math.nan)))
    assert len(r.bad_blocks) == MAX_BAD_BLOCKS and r.n_bad == r.n_faults == n


def test_a_zero_activation_scale_is_a_fault_without_data(tmp_path):
    ck = checkpoint(tmp_path, {"l.input_scale": torch.tensor([0.0, 2.0])})
    (q,) = detect(StandaloneScales(), ck)[0].values()
    r = grade.check(ck, q)
    assert r.bad_blocks == [{"index": [0], "scale": 0.0, "problem": "zero"}] and r.faulty
    assert r.dequant_absmax == 2.0 and r.stripes_read == 0


def test_pruned_and_full_reads_agree(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(64, 8, generator=g) * 100).clamp(-448, 448)
    s = torch.rand(32, 4, generator=g) * 0.01 + 0.001
    s[20, 3] = 0.5  # the absmax's block
    s[3, 1] = 0.0
    ck, q = _fp8(tmp_path, w, s)
    pruned = grade.check(ck, q)
    monkeypatch.setattr(grade, "FULL_PASS_FRACTION", 10**9)  # past one stripe: every stripe
    full = grade.check(ck, q)
    assert pruned.stripes_read < full.stripes_read == 32
    assert (pruned.dequant_absmax, pruned.bad_blocks) == (full.dequant_absmax, full.bad_blocks)
    assert pruned.dequant_absmax == pytest.approx(0.5 * float(w.to(E4M3).float()[40:42, 6:8].abs().max()))
