"""load/quant/scales.py and the formats around it. Activation, KV and global scales (``format: "scale"``): NaN, Inf, zero or negative is ``bad_scale``;
DeepSeek-V4 ``X.scale`` (E8M0 and fp32) and Quark ``weight_scale``; integer/fp8/fp4 layer weights whose
scales are not found are ``weights.unchecked`` with reason "scales not found", never clean."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

import nan_hunter
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.quant.scales import SUFFIXES, StandaloneScales
from nan_hunter.load.weights import scan_weights

from .kit import checkpoint as quant_checkpoint
from .kit import detect, graded


def _scan(tmp_path, tensors):
    p = tmp_path / "m.safetensors"
    save_file(tensors, str(p))
    ws = scan_weights(open_checkpoint(p))
    return ws, {q.name: q for q in ws.quantized}, p


def test_activation_and_kv_scales(tmp_path):
    w = torch.ones(4, 8).to(torch.float8_e4m3fn)
    ws, q, p = _scan(
        tmp_path,
        {
            "l.q_proj.weight": w,
            "l.q_proj.weight_scale": torch.tensor(0.5),
            "l.q_proj.input_scale": torch.tensor(0.0),  # zero: every activation lost
            "l.attn.k_scale": torch.tensor(-1.0),
            "l.attn.v_scale": torch.tensor(1.0),
            "l.mlp.input_global_scale": torch.tensor([math.nan, 2.0]),
        },
    )
    assert q["l.q_proj.input_scale"].bad_blocks == [{"index": [], "scale": 0.0, "problem": "zero"}]
    assert q["l.attn.k_scale"].bad_blocks == [{"index": [], "scale": -1.0, "problem": "negative"}]
    assert q["l.mlp.input_global_scale"].bad_blocks == [{"index": [0], "scale": "nan", "problem": "nan"}]
    assert q["l.attn.v_scale"].format == "scale" and not q["l.attn.v_scale"].bad_blocks
    assert q["l.attn.v_scale"].n_blocks == 1 and q["l.mlp.input_global_scale"].n_blocks == 2
    rep = nan_hunter.scan(str(p))
    assert rep.exit_code() == 1 and rep.diagnosis.cause == "bad_scale"
    assert "l.attn.k_scale" in " ".join(rep.diagnosis.evidence)


def test_deepseek_v4_scale_e8m0_and_fp32(tmp_path):
    w = torch.ones(256, 256).to(torch.float8_e4m3fn)
    e8 = torch.full((2, 2), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    e8.view(torch.uint8)[1, 0] = 0xFF  # E8M0 NaN
    fp = torch.ones(2, 2)
    fp[0, 1] = 0.0
    fp4 = torch.randint(0, 256, (8, 32), dtype=torch.uint8)
    ws, q, _ = _scan(
        tmp_path,
        {
            "a.weight": w,
            "a.scale": e8,
            "b.weight": w.clone(),
            "b.scale": fp,
            "c.weight": fp4,
            "c.scale": torch.full((8, 2), 127, dtype=torch.uint8),
        },
    )
    assert q["a.weight"].format == "fp8_block" and q["a.weight"].bad_blocks == [
        {"index": [1, 0], "scale": "nan", "problem": "nan"}
    ]
    assert q["b.weight"].bad_blocks == [{"index": [0, 1], "scale": 0.0, "problem": "zero"}]
    assert q["c.weight"].format == "mxfp4" and q["c.weight"].n_blocks == 16 and not ws.unchecked


def test_scales_not_found_is_never_clean(tmp_path):
    ws, q, p = _scan(
        tmp_path,
        {
            "l.weight": torch.ones(4, 8).to(torch.float8_e4m3fn),
            "m.qweight": torch.zeros(4, 8, dtype=torch.int32),
            "n.weight": torch.ones(4, 8, dtype=torch.int8),
            "ids": torch.arange(4),
        },
    )
    assert not q
    assert sorted((u["name"], u["reason"]) for u in ws.unchecked) == [
        ("l.weight", "scales not found"),
        ("m.qweight", "scales not found"),
        ("n.weight", "scales not found"),
    ]
    from nan_hunter.render.rows import verdict

    v = verdict(nan_hunter.scan(str(p)))
    assert "3 tensors not checked" in v.text and v.tone == "warn"


# --- the format on its own ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, problem", [(math.nan, "nan"), (math.inf, "inf"), (0.0, "zero"), (-0.5, "negative")]
)
def test_every_bad_value_is_a_fault(tmp_path, value, problem):
    (r,) = graded(
        StandaloneScales(), quant_checkpoint(tmp_path, {"l.k_scale": torch.tensor([1.0, value])})
    ).values()
    assert (
        r.format == "scale"
        and r.faulty
        and r.bad_blocks[0]["index"] == [1]
        and r.bad_blocks[0]["problem"] == problem
    )


def test_claims_every_suffix_and_skips_empty_and_integer_ones(tmp_path):
    names = {f"l{s}": torch.ones(1) for s in SUFFIXES} | {
        "e.input_scale": torch.ones(0),
        "i.input_scale": torch.ones(1, dtype=torch.int32),
    }
    found, ctx = detect(StandaloneScales(), quant_checkpoint(tmp_path, names))
    assert set(found) == {f"l{s}" for s in SUFFIXES}
    assert "e.input_scale" in ctx.claimed and "i.input_scale" not in ctx.claimed  # empty: nothing to judge
