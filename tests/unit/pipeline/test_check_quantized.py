"""``check`` on quantized checkpoints judges what a run computes (issue 48, item 1): the headroom rules
read dequantized weights, never scale tensors or stored codes; non-finite dequantized values count in
``overflows`` and ``dequant_nonfinite``; the cause is per tensor and the worst/first leads; the shard is
named. Checkpoints written by safetensors / gguf-py; each test failed before the fix."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.config import load_config
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.pipeline.ci_check import CheckOptions, check_checkpoint

CFG = load_config()
E4M3 = torch.float8_e4m3fn
DOWN = "model.layers.0.mlp.down_proj.weight"


def _fp8_dir(tmp, bad_scale: float | None = None, as_fp32: bool = False):
    """A DeepSeek-style fp8 file: 256x256 e4m3 codes (|code| up to 448) with 128x128 weight_scale_inv
    blocks of 0.01; ``bad_scale`` in block [1, 0]. ``as_fp32``: the same dequantized values stored as fp32."""
    d = tmp / ("f32" if as_fp32 else "fp8")
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(256, 256, generator=g) * 100).clamp(-448, 448).to(E4M3)
    w[200, 3] = 448.0  # a code at e4m3's max, in the block whose scale is bad
    s = torch.full((2, 2), 0.01)
    if bad_scale is not None:
        s[1, 0] = bad_scale
    t = {DOWN: w, DOWN + "_scale_inv": s, "model.norm.weight": torch.ones(256)}
    if as_fp32:
        t = {
            DOWN: w.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1),
            "model.norm.weight": torch.ones(256),
        }
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    )
    return open_checkpoint(d / "model.safetensors")


def _check(ck, dtypes=("fp16", "bf16")):
    rep = check_checkpoint(ck, str(ck.path), list(dtypes), CheckOptions(), CFG)
    return rep, {r["rule"]: r for r in rep.check["results"]}


def test_an_fp8_scale_block_of_1000_fails_fp16_as_the_same_values_in_fp32_do(tmp_path):
    rep, res = _check(_fp8_dir(tmp_path, 1000.0))
    _, ref = _check(_fp8_dir(tmp_path, 1000.0, as_fp32=True))
    for dt, status in (("fp16", "fail"), ("bf16", "pass")):
        assert res[f"weights.headroom.{dt}"]["status"] == ref[f"weights.headroom.{dt}"]["status"] == status
    msg = res["weights.headroom.fp16"]["message"]
    assert f"{DOWN} (dequantized fp8_block)" in msg and "_scale_inv" not in msg and "448000" in msg
    assert not rep.check["passed"]


def test_a_correct_fp8_checkpoint_is_not_near_max_at_its_codes(tmp_path):
    rep, res = _check(_fp8_dir(tmp_path))
    assert rep.check["passed"] and res["weights.headroom.fp16"]["status"] == "pass"
    assert rep.weights["near_overflow"] == []  # codes reach 448 by design; scales are not weights
    (q,) = rep.weights["quantized"]
    assert q["dequant_absmax"] == pytest.approx(4.48) and q["dequant_nonfinite"] == 0


def test_dequantized_overflow_is_listed_near_max_by_its_dequantized_values(tmp_path):
    rep, _ = _check(_fp8_dir(tmp_path, 1000.0))
    (row,) = rep.weights["near_overflow"]
    assert (row["name"], row["dtype"], row["absmax"], row["dequantized"]) == (
        DOWN,
        "fp8_block",
        448000.0,
        True,
    )
    assert "fp16" in row["overflows"] and "bf16" not in row["overflows"]


@pytest.mark.parametrize("scale, nonfinite", [(math.inf, 128 * 128), (math.nan, 128 * 128)])
def test_nonfinite_scales_count_as_nonfinite_dequantized_values(tmp_path, scale, nonfinite):
    rep, res = _check(_fp8_dir(tmp_path, scale))
    (q,) = rep.weights["quantized"]
    # every value of the block is NaN/Inf (0 x inf is NaN); the absmax is over the finite ones
    assert q["dequant_nonfinite"] == nonfinite and q["overflows"] == {"fp16": True, "bf16": True}
    assert q["dequant_absmax"] == pytest.approx(4.48)
    assert q["bad_blocks"][0]["scale"] == ("inf" if scale == math.inf else "nan")  # v1.2's strings stay
    assert res["weights.quantized"]["status"] == "fail" and res["weights.nonfinite"]["status"] == "pass"
    assert rep.diagnosis.cause == "bad_scale"


def test_a_nan_code_counts_in_the_dequantized_values(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    w = torch.ones(128, 128).to(E4M3)
    w.view(torch.uint8)[5, 7] = 0x7F  # e4m3fn's NaN
    save_file({"l.weight": w, "l.weight_scale": torch.tensor([0.5])}, str(d / "model.safetensors"))
    rep, res = _check(open_checkpoint(d / "model.safetensors"))
    (q,) = rep.weights["quantized"]
    assert q["dequant_nonfinite"] == 1 and q["overflows"] == {"fp16": True, "bf16": True}
    assert q["dequant_absmax"] == 0.5
    assert res["weights.nonfinite"]["status"] == "fail" and rep.diagnosis.cause == "nonfinite_weights"


def _gguf(path, tensors):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    for name, (arr, tname) in tensors.items():
        if tname is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=gguf.GGMLQuantizationType[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return open_checkpoint(path)


def _q8(d: float | None = None, row: int = 1, block: int = 1):
    """Q8_0 rows quantized by gguf-py; ``d`` planted in one block's fp16 scale."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    q = quantize(x, gguf.GGMLQuantizationType.Q8_0).copy()
    if d is not None:
        q[row, block * 34 : block * 34 + 2] = np.array([d], np.float16).view(np.uint8)
    return q


def test_a_plain_f32_tensor_with_neginf_is_nonfinite_weights_and_both_causes_are_named(tmp_path):
    norm = np.ones(64, np.float32)
    norm[3] = -np.inf
    ck = _gguf(
        tmp_path / "m.gguf",
        {"blk.0.attn_norm.weight": (norm, None), "blk.0.attn_q.weight": (_q8(np.inf), "Q8_0")},
    )
    rep, res = _check(ck)
    assert rep.diagnosis.cause == "nonfinite_weights"  # first in checkpoint order
    assert any(
        e.startswith("also (bad_scale): ") and "blk.0.attn_q.weight" in e for e in rep.diagnosis.evidence
    )
    assert res["weights.nonfinite"]["status"] == res["weights.quantized"]["status"] == "fail"
    (q,) = rep.weights["quantized"]
    assert q["dequant_nonfinite"] == 32 and q["overflows"]["fp16"] is True


def test_an_inf_scale_is_headlined_over_a_zero_scale(tmp_path):
    ck = _gguf(
        tmp_path / "m.gguf",
        {"blk.0.attn_k.weight": (_q8(0.0, 0, 0), "Q8_0"), "blk.0.attn_q.weight": (_q8(np.inf), "Q8_0")},
    )
    rep, res = _check(ck)
    assert (
        rep.diagnosis.cause == "bad_scale" and "blk.0.attn_q.weight has a Inf scale" in rep.diagnosis.summary
    )
    assert res["weights.quantized"]["message"].startswith("blk.0.attn_q.weight (gguf:Q8_0)")


def test_gguf_dequantized_overflow_fails_fp16(tmp_path):
    ck = _gguf(tmp_path / "m.gguf", {"blk.0.attn_q.weight": (_q8(60000.0), "Q8_0")})
    _, res = _check(ck)
    assert (
        res["weights.headroom.fp16"]["status"] == "fail" and res["weights.headroom.bf16"]["status"] == "pass"
    )


def test_a_bad_tensor_in_a_sharded_checkpoint_names_its_shard(tmp_path):
    d = tmp_path / "sh"
    d.mkdir()
    bad = torch.ones(4, 4)
    bad[1, 2] = math.nan
    save_file({"a.weight": torch.ones(4, 4)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": bad}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a.weight": "model-00001-of-00002.safetensors",
                    "b.weight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    rep, res = _check(open_checkpoint(d / "model.safetensors.index.json"))
    (nf,) = rep.weights["nonfinite"]
    assert nf["file"] == "model-00002-of-00002.safetensors"
    assert "b.weight in model-00002-of-00002.safetensors" in res["weights.nonfinite"]["message"]
    assert "model-00002-of-00002.safetensors" in rep.diagnosis.evidence[0]
