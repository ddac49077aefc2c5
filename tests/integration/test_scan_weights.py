"""Weights scan through the real CLI (in this process, ``cli_main``): formats, planted faults, report
v1 keys, exit codes. What ``--help`` imports (no torch) is tests/unit/cli/test_entry_point.py's;
exit codes from a real process are tests/integration/test_outputs.py's (closed stdout) and
test_bad_input.py's."""

from __future__ import annotations

import json
import math

import torch
from safetensors.torch import save_file

from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.load.weights import scan_tensor

V1_KEYS = {
    "schema",
    "nanhunter_version",
    "torch_version",
    "checkpoint",
    "weights",
    "run",
    "first_nonfinite",
    "replay",
    "diagnosis",
}


def test_clean_file_exit_0_and_v1_keys(cli_main, tmp_path):
    save_file(
        {"a": torch.randn(8, 8), "b": torch.randn(3).bfloat16(), "i": torch.arange(4), "e": torch.empty(0)},
        str(tmp_path / "c.safetensors"),
    )
    res = cli_main("scan", tmp_path / "c.safetensors")
    assert res.code == 0, res.stderr
    r = res.report
    assert V1_KEYS <= set(r)
    assert r["schema"] == "nanhunter.report/v1"
    assert (
        r["run"] is None and r["first_nonfinite"] is None and r["replay"] is None and r["diagnosis"] is None
    )
    assert r["weights"]["n_tensors"] == 4 and r["weights"]["nonfinite"] == []
    assert r["checkpoint"]["format"] == "safetensors" and r["checkpoint"]["n_tensors"] == 4
    assert "weights-only" in res.stdout


def test_planted_nan_and_inf_named_with_index(cli_main, tmp_path):
    w = torch.randn(16, 32)
    w[3, 7] = float("nan")
    w[5, 1] = float("nan")
    b = torch.randn(10).to(torch.bfloat16)
    b[9] = float("-inf")
    save_file({"layer.weight": w, "layer.bias": b, "ok": torch.ones(3)}, str(tmp_path / "bad.safetensors"))
    res = cli_main("scan", tmp_path / "bad.safetensors")
    assert res.code == 1
    bad = {t["name"]: t for t in res.report["weights"]["nonfinite"]}
    assert set(bad) == {"layer.weight", "layer.bias"}
    assert bad["layer.weight"]["nan"] == 2 and bad["layer.weight"]["first_index"] == [3, 7]
    assert bad["layer.bias"]["neginf"] == 1 and bad["layer.bias"]["first_index"] == [9]
    assert res.report["diagnosis"]["cause"] == "nonfinite_weights"
    assert "layer.weight" in res.stdout


def test_sharded_hf_checkpoint_with_planted_inf(cli_main, tmp_path, minilm_dir):
    """A real sharded HF checkpoint (MiniLM split in two shards) with one +inf planted."""
    ck = open_checkpoint(minilm_dir)
    names = ck.names()
    half = len(names) // 2
    target = "encoder.layer.3.attention.self.key.weight"
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    d = tmp_path / "minilm-sharded"
    d.mkdir()
    weight_map = {}
    for fname, keys in shards.items():
        sd = {k: ck.tensor(k).clone() for k in keys}
        if target in sd:
            sd[target][17, 42] = float("inf")
        save_file(sd, str(d / fname))
        weight_map.update({k: fname for k in keys})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in (
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        (d / f).write_bytes((minilm_dir / f).read_bytes())
    res = cli_main("scan", d, "--prompt", "hello world")
    assert res.code == 1, res.stderr
    r = res.report
    assert r["checkpoint"]["format"] == "hf"
    (bad,) = r["weights"]["nonfinite"]
    assert bad["name"] == target and bad["posinf"] == 1 and bad["first_index"] == [17, 42]
    assert r["first_nonfinite"]["module"] == "encoder.layer.3.attention.self.key"
    assert r["first_nonfinite"]["role"] == "weights"
    assert r["diagnosis"]["cause"] == "nonfinite_weights"


def test_headroom_and_underflow_per_tensor():
    t = torch.tensor([70000.0, 1e-9, 1e-6, 0.0, 1.0])
    s = scan_tensor("t", t, exact=True)
    assert s.overflows == {"fp16": True, "bf16": False, "fp8-e4m3": True, "fp8-e5m2": True}
    assert math.isclose(s.headroom["fp16"], 65504 / 70000)
    assert s.fp16_zero_frac == 1 / 5  # 1e-9 flushes to zero in fp16
    assert s.fp16_subnormal_frac == 1 / 5  # 1e-6 becomes an fp16 subnormal
    assert math.isclose(s.min_nonzero, 1e-9, rel_tol=1e-6)


def test_non_float_and_empty_skipped():
    assert scan_tensor("i", torch.arange(5)).skipped == "not floating point"
    assert scan_tensor("e", torch.empty(0, 3)).skipped == "empty"


def test_json_to_stdout_is_valid(cli_main, tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "c.safetensors"))
    res = cli_main("scan", tmp_path / "c.safetensors", "--json", "-", json_report=False)
    assert res.code == 0
    assert json.loads(res.stdout)["schema"] == "nanhunter.report/v1"
