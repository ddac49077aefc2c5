"""The real CLI on quantized checkpoints: bad_scale exits 1; check --baseline exits 1 on a regression."""

from __future__ import annotations

import json
import math

import torch
from clirun import invoke
from safetensors.torch import save_file


def test_scan_bad_scale_exit_1_and_check_baseline(tmp_path):
    w = torch.ones(256, 128).to(torch.float8_e4m3fn)
    s = torch.tensor([[1.0], [math.inf]])
    save_file({"l.weight": w, "l.weight_scale_inv": s}, str(tmp_path / "q.safetensors"))
    r = invoke("scan", tmp_path / "q.safetensors", "--json", tmp_path / "r.json")
    assert r.code == 1, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["diagnosis"]["cause"] == "bad_scale"
    assert rep["weights"]["quantized"][0]["bad_blocks"] == [
        {"index": [1, 0], "scale": "inf", "problem": "inf"}
    ]
    save_file({"w": torch.full((2, 2), 1.0)}, str(tmp_path / "old.safetensors"))
    save_file({"w": torch.full((2, 2), 10000.0)}, str(tmp_path / "new.safetensors"))  # under the 20 dB floor
    r = invoke(
        "check",
        tmp_path / "new.safetensors",
        "--baseline",
        tmp_path / "old.safetensors",
        "--dtypes",
        "fp16",
        "--junit",
        tmp_path / "j.xml",
        env={"GITHUB_ACTIONS": "true"},
    )
    assert r.code == 1, r.stderr
    assert 'name="headroom_regression.fp16"' in (tmp_path / "j.xml").read_text()
    assert "::error" in r.stdout + r.stderr and "96.3 dB" in r.stdout + r.stderr
    r = invoke("check", tmp_path / "new.safetensors", "--baseline", tmp_path / "missing.safetensors")
    assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (
        f"--baseline {tmp_path / 'missing.safetensors'}: checkpoint not found" in r.stderr
    )  # named as the baseline


def test_no_output_overwrites_the_baseline(tmp_path):
    save_file({"w": torch.full((2, 2), 1.0)}, str(tmp_path / "old.safetensors"))
    save_file({"w": torch.full((2, 2), 2.0)}, str(tmp_path / "new.safetensors"))
    before = (tmp_path / "old.safetensors").read_bytes()
    r = invoke(
        "check",
        tmp_path / "new.safetensors",
        "--baseline",
        tmp_path / "old.safetensors",
        "--json",
        tmp_path / "old.safetensors",
    )
    assert (
        r.code == 2 and len(r.stderr.strip().splitlines()) == 1 and "is an input of this command" in r.stderr
    )
    assert (tmp_path / "old.safetensors").read_bytes() == before
