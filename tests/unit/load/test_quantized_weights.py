"""Quantized weights (contract v1.2 "Every checkpoint format"): checkpoints written by the real
compressed-tensors compressors (int4 pack-quantized with and without zero points, int8, fp8
channel, NVFP4, MXFP4), hand-built DeepSeek-V3 fp8 block, gpt-oss MXFP4 and modelopt NVFP4
layouts; the dequantized absmax against the library's own decompression, and bad scales."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.config import default_config
from nan_hunter.explain.weights_verdict import weights_section as weights_block
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_weights

F4 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _quantized(path):
    ws = scan_weights(open_checkpoint(path))
    return ws, {q.name: q for q in ws.quantized}


def _save_dir(tmp_path, tensors, qc=None):
    d = tmp_path / "ck"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    if qc is not None:
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qc}))
    return d


def test_fp8_block_deepseek_layout(tmp_path):
    torch.manual_seed(0)
    w = (torch.randn(300, 260) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(3, 3) + 0.5
    d = _save_dir(
        tmp_path,
        {"l.weight": w, "l.weight_scale_inv": s},
        {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    )
    ws, q = _quantized(d)
    r = q["l.weight"]
    ref = (w.float() * s.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :260]).abs().max()
    assert (
        r.format == "fp8_block" and r.scale == "l.weight_scale_inv" and r.n_blocks == 9 and not r.bad_blocks
    )
    assert r.dequant_absmax == pytest.approx(float(ref), rel=1e-6)
    assert r.overflows == {"fp16": False, "bf16": False}
    # corrupt: NaN, Inf, zero on a block holding data, a negative scale
    s[1, 2], s[2, 1], s[0, 0], s[0, 1] = math.nan, math.inf, 0.0, -1.0
    save_file({"l.weight": w, "l.weight_scale_inv": s}, str(d / "model.safetensors"))
    ws, q = _quantized(d)
    bad = {tuple(b["index"]): b for b in q["l.weight"].bad_blocks}
    assert bad[(1, 2)] == {"index": [1, 2], "scale": "nan", "problem": "nan"}
    assert bad[(2, 1)]["problem"] == "inf" and bad[(0, 0)]["problem"] == "zero"
    assert bad[(0, 1)] == {"index": [0, 1], "scale": -1.0, "problem": "negative"}
    block = weights_block(ws, default_config())
    assert block["quantized"][0]["bad_blocks"] and block["quantized"][0]["format"] == "fp8_block"


def test_zero_scale_on_an_all_zero_block_is_fine(tmp_path):
    w = torch.zeros(256, 128).to(torch.float8_e4m3fn)
    w[200, 5] = 1.0
    s = torch.tensor([[0.0], [2.0]])
    _, q = _quantized(_save_dir(tmp_path, {"l.weight": w, "l.weight_scale_inv": s}))
    assert q["l.weight"].bad_blocks == [] and q["l.weight"].dequant_absmax == 2.0


def test_fp8_overflow_of_fp16(tmp_path):
    w = torch.full((4, 8), 448.0).to(torch.float8_e4m3fn)
    _, q = _quantized(_save_dir(tmp_path, {"l.weight": w, "l.weight_scale": torch.tensor(1000.0)}))
    r = q["l.weight"]
    assert r.format == "fp8_tensor" and r.dequant_absmax == 448000.0
    assert r.overflows == {"fp16": True, "bf16": False}


def test_gpt_oss_mxfp4(tmp_path):
    torch.manual_seed(0)
    blocks = torch.randint(0, 256, (2, 4, 3, 16), dtype=torch.uint8)
    scales = torch.randint(120, 135, (2, 4, 3), dtype=torch.uint8)
    scales[1, 2, 0] = 0xFF  # E8M0 NaN
    _, q = _quantized(
        _save_dir(
            tmp_path,
            {"m.experts.gate_up_proj_blocks": blocks, "m.experts.gate_up_proj_scales": scales},
            {"quant_method": "mxfp4"},
        )
    )
    r = q["m.experts.gate_up_proj_blocks"]
    v = torch.stack([F4[(blocks & 15).long()], F4[(blocks >> 4).long()]], -1).reshape(2, 4, 3, 32)
    sc = torch.pow(2.0, scales.float() - 127)
    sc[scales == 0xFF] = math.nan
    ref = (v * sc.unsqueeze(-1)).nan_to_num(0).abs().max()
    assert r.format == "mxfp4" and r.n_blocks == 24
    assert r.bad_blocks == [{"index": [1, 2, 0], "scale": "nan", "problem": "nan"}]
    assert r.dequant_absmax == float(ref)


def test_modelopt_nvfp4(tmp_path):
    torch.manual_seed(0)
    packed = torch.randint(0, 256, (8, 16), dtype=torch.uint8)  # [out, in/2], in = 32: two blocks of 16
    scale = (torch.rand(8, 2) * 4 + 0.1).to(torch.float8_e4m3fn)
    s2 = torch.tensor(0.5)
    _, q = _quantized(
        _save_dir(
            tmp_path,
            {"l.weight": packed, "l.weight_scale": scale, "l.weight_scale_2": s2},
            {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        )
    )
    r = q["l.weight"]
    v = torch.stack([F4[(packed & 15).long()], F4[(packed >> 4).long()]], -1).reshape(8, 2, 16)
    ref = (v * scale.float().unsqueeze(-1) * 0.5).abs().max()
    assert r.format == "nvfp4" and r.n_blocks == 16 and not r.bad_blocks
    assert r.dequant_absmax == pytest.approx(float(ref))


# --- written by the compressed-tensors package ------------------------------------------------


def _ct(preset, compressor, sd):
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import preset_name_to_scheme

    sch = preset_name_to_scheme(preset, ["Linear"])
    comp = getattr(ct.compressors, compressor)
    out = comp.compress(dict(sd), sch)
    ref = comp.decompress(dict(out), sch)["weight"].float().abs().max()
    return {f"model.layers.0.mlp.down_proj.{k}": v.contiguous() for k, v in out.items()}, float(ref)


W = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
G128 = W.float().reshape(64, 2, 128).abs().amax(-1)
CASES = {
    "int4_group": (
        "W4A16",
        "PackedQuantizationCompressor",
        {"weight": W, "weight_scale": (G128 / 7).bfloat16()},
        "int_group",
    ),
    "int4_asym": (
        "W4A16_ASYM",
        "PackedQuantizationCompressor",
        {
            "weight": W,
            "weight_scale": (G128 / 7).bfloat16(),
            "weight_zero_point": torch.tensor([[1, -2]] * 64, dtype=torch.int8),
        },
        "int_group",
    ),
    "int8_channel": (
        "W8A16",
        "NaiveQuantizationCompressor",
        {"weight": W, "weight_scale": (W.float().abs().amax(-1, keepdim=True) / 127).bfloat16()},
        "int_group",
    ),
    "fp8_channel": (
        "FP8",
        "FloatQuantizationCompressor",
        {"weight": W, "weight_scale": (W.float().abs().amax(-1, keepdim=True) / 448).bfloat16()},
        "fp8_channel",
    ),
    "nvfp4": (
        "NVFP4",
        "NVFP4PackedCompressor",
        {
            "weight": W,
            "weight_scale": W.float().reshape(64, 16, 16).abs().amax(-1) / 6 * (448 * 6 / 4.5),
            "weight_global_scale": torch.tensor([448 * 6 / 4.5]),
        },
        "nvfp4",
    ),
    "mxfp4": (
        "MXFP4",
        "MXFP4PackedCompressor",
        {
            "weight": W,
            "weight_scale": torch.exp2(
                torch.ceil(torch.log2(W.float().reshape(64, 8, 32).abs().amax(-1) / 6))
            ),
        },
        "mxfp4",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compressed_tensors(tmp_path, case):
    preset, comp, sd, fmt = CASES[case]
    tensors, ref = _ct(preset, comp, sd)
    d = _save_dir(tmp_path, tensors, {"quant_method": "compressed-tensors"})
    ws, q = _quantized(d)
    name = next(iter(q))
    r = q[name]
    assert r.format == fmt and not r.bad_blocks and not ws.unchecked, (r, ws.unchecked)
    assert r.dequant_absmax == pytest.approx(ref, rel=1e-2), (r.dequant_absmax, ref)
    # a NaN scale on one block is found and named
    sname = r.scale
    s = tensors[sname].clone()
    if s.dtype == torch.uint8:
        s.view(-1)[3] = 0xFF
    else:
        s.view(torch.uint8).view(-1)[s.element_size() * 3 : s.element_size() * 4] = 0xFF  # all ones: NaN
    save_file({**tensors, sname: s}, str(d / "model.safetensors"))
    _, q = _quantized(d)
    assert [b["problem"] for b in q[name].bad_blocks] == ["nan"]


def test_small_windows_give_the_same_answer(tmp_path, monkeypatch):
    """Stripe by stripe: with 4 KB pieces and 8 KB windows (many pieces per tensor, stripes split
    across windows), bad blocks and dequantized absmax are the same as with the default window."""
    import nan_hunter.load.safetensors_file as sf

    torch.manual_seed(1)
    w = (torch.randn(300, 260) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(3, 3) + 0.5
    s[2, 2] = math.nan
    blocks = torch.randint(0, 256, (3, 40, 3, 16), dtype=torch.uint8)
    scales = torch.randint(100, 140, (3, 40, 3), dtype=torch.uint8)
    scales[2, 39, 2] = 0xFF
    tensors, _ = _ct(*CASES["int4_asym"][:3])
    d = _save_dir(
        tmp_path,
        {
            "l.weight": w,
            "l.weight_scale_inv": s,
            "e.gate_up_proj_blocks": blocks,
            "e.gate_up_proj_scales": scales,
            **tensors,
        },
    )
    _, before = _quantized(d)
    monkeypatch.setattr(sf, "PIECE", 4096)
    monkeypatch.setattr(sf, "WINDOW", 8192)
    _, after = _quantized(d)
    assert len(before) == 3
    for name, r in before.items():
        assert (after[name].bad_blocks, after[name].dequant_absmax) == (r.bad_blocks, r.dequant_absmax), name
    assert before["e.gate_up_proj_blocks"].bad_blocks == [
        {"index": [2, 39, 2], "scale": "nan", "problem": "nan"}
    ]


def test_moe_fp8_block_experts(tmp_path):
    """[E, out, in] with scales [E, out/128, in/128]: blocks per expert. An expert whose rows are not
    whole blocks (200 rows: a block of 128 and a partial one of 72) is checked block by block on its
    own rows (contract v1.3), never mixed with the next expert's."""
    w = torch.ones(2, 256, 128).to(torch.float8_e4m3fn)
    s = torch.ones(2, 2, 1)
    s[1, 0, 0] = math.nan
    ws, q = _quantized(_save_dir(tmp_path, {"e.weight": w, "e.weight_scale_inv": s}))
    assert q["e.weight"].bad_blocks == [{"index": [1, 0, 0], "scale": "nan", "problem": "nan"}]
    w2 = torch.ones(2, 200, 128)
    w2[1, 128:] = 0  # expert 1's partial block holds no data
    w2[0, 150, 3] = 400.0
    s2 = torch.tensor([[[1.0], [0.0]], [[2.0], [0.0]]])  # expert 0's partial block holds data: zero is bad
    save_file(
        {"e.weight": w2.to(torch.float8_e4m3fn), "e.weight_scale_inv": s2},
        str(tmp_path / "ck" / "model.safetensors"),
    )
    ws, q = _quantized(tmp_path / "ck")
    r = q["e.weight"]
    assert r.format == "fp8_block" and r.n_blocks == 4 and not ws.unchecked
    assert r.bad_blocks == [{"index": [0, 1, 0], "scale": 0.0, "problem": "zero"}]
    assert r.dequant_absmax == 2.0  # expert 0's 400 sits in the zero-scale block; expert 1: 1 x 2
    s2[0, 1, 0] = 3.0
    save_file(
        {"e.weight": w2.to(torch.float8_e4m3fn), "e.weight_scale_inv": s2},
        str(tmp_path / "ck" / "model.safetensors"),
    )
    _, q = _quantized(tmp_path / "ck")
    assert q["e.weight"].bad_blocks == [] and q["e.weight"].dequant_absmax == 384.0 * 3  # 400 is 384 in e4m3
