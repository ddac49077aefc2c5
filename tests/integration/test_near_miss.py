"""Near misses: nothing non-finite yet, but absmax close to the run dtype's max (threshold from
configs/default.yaml, overridable with --config), and intermediates absorbed before an output."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

ARCH = """
import torch
def build():
    lin = torch.nn.Linear(4, 4, bias=False)
    return lin
"""


def _model(tmp_path, value):
    (tmp_path / "arch.py").write_text(ARCH)
    save_file({"weight": torch.full((4, 4), value)}, str(tmp_path / "m.safetensors"))
    save_file({"input": torch.ones(1, 4)}, str(tmp_path / "in.safetensors"))
    return [
        "scan",
        tmp_path / "m.safetensors",
        "--arch",
        f"{tmp_path / 'arch.py'}:build",
        "--inputs",
        tmp_path / "in.safetensors",
        "--dtype",
        "fp16",
    ]


def test_near_overflow_warns_but_exits_0(cli_main, tmp_path):
    res = cli_main(*_model(tmp_path, 10000.0))  # output 40000 = 61% of 65504
    assert res.code == 0
    nm = [n for n in res.report["near_misses"] if n["kind"] == "near_overflow"]
    assert nm and nm[0]["module"] == "" and nm[0]["absmax"] == 40000.0
    assert "near miss" in res.stdout


def test_threshold_from_config(cli_main, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("near_miss:\n  overflow_fraction: 0.9\n")
    res = cli_main(*_model(tmp_path, 10000.0), "--config", cfg)
    assert res.code == 0
    assert not [n for n in res.report["near_misses"] if n["kind"] == "near_overflow"]


def test_bad_config_exit_2(cli_main, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("near_miss: [unclosed\n")
    res = cli_main(*_model(tmp_path, 1.0), "--config", cfg, json_report=False)
    assert res.code == 2 and "not valid YAML" in res.stderr


def test_absorbed_intermediate_rmsnorm(cli_main):
    root = "examples/incidents/rmsnorm_variance"
    res = cli_main(
        "scan",
        f"{root}/model.safetensors",
        "--arch",
        f"{root}/model.py:build",
        "--inputs",
        f"{root}/inputs.safetensors",
        "--dtype",
        "fp16",
    )
    assert res.code == 0
    absorbed = [n for n in res.report["near_misses"] if n["kind"] == "absorbed"]
    assert absorbed and absorbed[0]["op"] == "aten.pow.Tensor_Scalar" and absorbed[0]["module"] == "norm"
