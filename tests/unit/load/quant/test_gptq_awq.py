"""GPTQ and AWQ checkpoints written by the libraries' own packing code (``tests/data/quant``, made by
``make_fixtures.py``: gptqmodel 7.7.0's ``pack_block`` and v1 zero conversion, AutoAWQ 0.2.9's
``from_linear``), checked against the libraries' own dequantization (``expected.json``): 2/3/4/8-bit,
symmetric and asymmetric, v1 and v2 zero points, act-order ``g_idx``, AWQ GEMM and GEMV. Then
corrupted: NaN and zero scales, and zero points of the other convention (``bad_zero_point``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import nan_hunter
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights

DATA = Path(__file__).resolve().parents[3] / "data" / "quant"
EXPECTED = json.loads((DATA / "expected.json").read_text())
LAYER = "model.layers.0.mlp.down_proj"
GPTQ = sorted(k for k in EXPECTED if k.startswith("gptq"))
AWQ = sorted(k for k in EXPECTED if k.startswith("awq"))


def _copy(tmp_path, name) -> Path:
    d = tmp_path / name
    shutil.copytree(DATA / name, d)
    return d


def _scan(d):
    ws = scan_weights(open_checkpoint(d))
    return ws, {q.name: q for q in ws.quantized}


def _set_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"].update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("case", GPTQ + AWQ)
def test_absmax_matches_the_library(tmp_path, case):
    ws, q = _scan(_copy(tmp_path, case))
    r = q[f"{LAYER}.qweight"]
    assert r.format == case.split("_")[0] and r.scale == f"{LAYER}.scales"
    assert not r.bad_blocks and not ws.unchecked, (r.bad_blocks, ws.unchecked)
    assert r.dequant_absmax == pytest.approx(EXPECTED[case]["dequant_absmax"], rel=2e-3)
    assert r.overflows == {"fp16": False, "bf16": False}


@pytest.mark.parametrize("case", GPTQ + AWQ)
def test_nan_and_zero_scales_are_named(tmp_path, case):
    d = _copy(tmp_path, case)
    t = load_file(str(d / "model.safetensors"))
    s = t[f"{LAYER}.scales"].clone()
    s[1, 5] = math.nan
    s[2, 3] = 0.0  # a group holding data (random weights): every code is not the zero point
    save_file({**t, f"{LAYER}.scales": s}, str(d / "model.safetensors"))
    _, q = _scan(d)
    bad = q[f"{LAYER}.qweight"].bad_blocks
    assert bad == [
        {"index": [1, 5], "scale": "nan", "problem": "nan"},
        {"index": [2, 3], "scale": 0.0, "problem": "zero"},
    ]
    rep = nan_hunter.scan(str(d))
    assert rep.exit_code() == 1 and rep.diagnosis.cause == "bad_scale"
    assert "[1, 5]" in rep.diagnosis.summary and "group" in rep.diagnosis.summary


def test_gptq_zero_on_an_empty_group_is_fine(tmp_path):
    """A group whose codes all equal its zero point holds no data: a zero scale there is no fault."""
    d = _copy(tmp_path, "gptq_4bit_sym_v2")
    t = load_file(str(d / "model.safetensors"))
    qw = t[f"{LAYER}.qweight"].clone()
    qw[8:16, 10] = 0x88888888 - (1 << 32)  # inputs 64..127 (group 1) of output 10: all code 8 = the zero
    s = t[f"{LAYER}.scales"].clone()
    s[1, 10] = 0.0
    save_file({**t, f"{LAYER}.qweight": qw, f"{LAYER}.scales": s}, str(d / "model.safetensors"))
    _, q = _scan(d)
    assert q[f"{LAYER}.qweight"].bad_blocks == []


@pytest.mark.parametrize(
    "case,declared,found",
    [
        ("gptq_4bit_sym_v2", "gptq", "gptq_v2"),
        ("gptq_4bit_sym_v1", "gptq_v2", "gptq"),
        ("gptq_3bit_sym_v1", "gptq_v2", "gptq"),
        ("gptq_8bit_sym_v1", "gptq_v2", "gptq"),
    ],
)
def test_zero_points_of_the_other_convention(tmp_path, case, declared, found):
    """sym: true, zeros stored one way and declared the other: every weight is one step off."""
    d = _copy(tmp_path, case)
    _set_config(d, checkpoint_format=declared)
    ws, q = _scan(d)
    zp = [b for b in q[f"{LAYER}.qweight"].bad_blocks if b["problem"] == "zero_point"]
    bits = int(case.split("_")[1][0])
    assert len(zp) == 1 and zp[0]["declared"] == declared and zp[0]["found"] == found
    assert zp[0]["n_groups"] == 4 * 64 and zp[0]["index"] == [0, 0]
    assert zp[0]["zero_point"] == (1 << (bits - 1)) - (1 if found == "gptq" else 0)
    rep = nan_hunter.scan(str(d))
    assert rep.exit_code() == 1 and rep.diagnosis.cause == "bad_zero_point"
    assert repr(found) in rep.diagnosis.fix and "checkpoint_format" in rep.diagnosis.fix
    assert LAYER in rep.diagnosis.summary and repr(declared) in rep.diagnosis.summary


def test_asymmetric_zero_points_are_not_judged_by_convention(tmp_path):
    d = _copy(tmp_path, "gptq_3bit_asym_v1")
    _set_config(d, checkpoint_format="gptq_v2")  # asym: zeros vary, no midpoint to compare with
    _, q = _scan(d)
    assert not [b for b in q[f"{LAYER}.qweight"].bad_blocks if b["problem"] == "zero_point"]


def test_g_idx_outside_the_groups_is_not_checked(tmp_path):
    d = _copy(tmp_path, "gptq_4bit_sym_v2")
    t = load_file(str(d / "model.safetensors"))
    g = t[f"{LAYER}.g_idx"].clone()
    g[17] = 9
    save_file({**t, f"{LAYER}.g_idx": g}, str(d / "model.safetensors"))
    ws, q = _scan(d)
    assert not q and [u["name"] for u in ws.unchecked] == [f"{LAYER}.qweight"]
    assert "group 9" in ws.unchecked[0]["reason"]


def test_pruned_reads_give_the_full_pass_answer(tmp_path, monkeypatch):
    """A 2048-input GPTQ weight (32 stripes): the pruned pass reads the few stripes whose scales could
    hold the absmax (and the zero-scale group's); the same answer as reading every stripe in 4 KB
    windows."""
    import nan_hunter.load.quant.grade as grade
    import nan_hunter.load.safetensors_file as sf

    gen = torch.Generator().manual_seed(3)
    qweight = torch.randint(-(1 << 31), (1 << 31) - 1, (256, 64), dtype=torch.int32, generator=gen)
    qzeros = torch.full((32, 8), 0x88888888 - (1 << 32), dtype=torch.int32)  # v2 zeros: 8
    scales = (torch.rand(32, 64, generator=gen) * 0.01 + 0.001).half()
    scales[17, 40] = 0.5  # the absmax's group
    scales[5, 2] = 0.0
    d = tmp_path / "ck"
    d.mkdir()
    save_file(
        {f"{LAYER}.qweight": qweight, f"{LAYER}.qzeros": qzeros, f"{LAYER}.scales": scales},
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "gptq",
                    "bits": 4,
                    "group_size": 64,
                    "sym": True,
                    "checkpoint_format": "gptq_v2",
                }
            }
        )
    )
    _, before = _scan(d)
    monkeypatch.setattr(sf, "PIECE", 4096)
    monkeypatch.setattr(grade, "FULL_PASS_FRACTION", 10**9)  # past one stripe: read every stripe
    _, after = _scan(d)
    name = f"{LAYER}.qweight"
    assert before[name].stripes_read <= 4 and after[name].stripes_read == 32
    assert after[name].dequant_absmax == before[name].dequant_absmax
    assert (
        after[name].bad_blocks
        == before[name].bad_blocks
        == [{"index": [5, 2], "scale": 0.0, "problem": "zero"}]
    )
    codes = torch.stack([(qweight[:, 40] >> s) & 15 for s in range(0, 32, 4)], 1).reshape(-1)[
        17 * 64 : 18 * 64
    ]
    assert before[name].dequant_absmax == pytest.approx(0.5 * float((codes - 8).abs().max()))
