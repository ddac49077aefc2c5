"""bisect through the real CLI and apply_policy on the real MiniLM checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

import nan_hunter
from nan_hunter.bisection.search import run_bound

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture
def stack6(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("stack6", MODELS / "stack6.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    save_file(mod.build().state_dict(), str(tmp_path / "stack6.safetensors"))
    save_file({"x": torch.ones(2, 8)}, str(tmp_path / "in.safetensors"))
    save_file(mod.build_bad_everywhere().state_dict(), str(tmp_path / "logneg.safetensors"))
    return tmp_path, mod


def test_non_contiguous_culprits_exactly(cli, stack6):
    d, _ = stack6
    pol = d / "policy.yaml"
    res = cli("bisect", d / "stack6.safetensors", "--arch", f"{MODELS / 'stack6.py'}:build",
              "--inputs", d / "in.safetensors", "--dtype", "fp16", "--policy-out", pol)
    assert res.code == 0, res.stderr
    b = res.report["bisect"]
    assert b["keep_modules"] == ["layers.1", "layers.4"]
    assert b["finite_after"] is True and b["max_rel_err"] < 0.05
    assert b["runs"] <= run_bound(b["candidates"], 2) + 3  # search bound + reference, candidates, verify
    policy = yaml.safe_load(pol.read_text())
    assert policy["modules"] == {"layers.1": "fp32", "layers.4": "fp32"}


def test_block_granularity(cli, stack6):
    d, _ = stack6
    res = cli("bisect", d / "stack6.safetensors", "--arch", f"{MODELS / 'stack6.py'}:build",
              "--inputs", d / "in.safetensors", "--granularity", "block")
    assert res.code == 0
    assert res.report["bisect"]["keep_modules"] == ["layers.1", "layers.4"]


def test_fine_model_gives_empty_set(cli, tmp_path):
    lin = torch.nn.Linear(4, 4)
    save_file(lin.state_dict(), str(tmp_path / "lin.safetensors"))
    (tmp_path / "arch.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    save_file({"input": torch.randn(2, 4)}, str(tmp_path / "in.safetensors"))
    res = cli("bisect", tmp_path / "lin.safetensors", "--arch", f"{tmp_path / 'arch.py'}:build",
              "--inputs", tmp_path / "in.safetensors")
    assert res.code == 0
    assert res.report["bisect"]["keep_modules"] == []
    assert res.report["bisect"]["finite_after"] is True


def test_fails_even_in_fp32_exits_1(cli, stack6):
    d, _ = stack6
    res = cli("bisect", d / "logneg.safetensors", "--arch", f"{MODELS / 'stack6.py'}:build_bad_everywhere",
              "--inputs", d / "in.safetensors")
    assert res.code == 1
    assert res.report["bisect"]["finite_after"] is False
    assert "even with everything in fp32" in res.stdout


def test_over_inputs_names_failing_input(cli, stack6, tmp_path):
    d, _ = stack6
    # the hot blocks only overflow when x is large enough: 0.1 * 1e5 = 1e4 stays finite
    save_file({"x": torch.full((2, 8), 0.1)}, str(tmp_path / "small.safetensors"))
    res = cli("bisect", d / "stack6.safetensors", "--arch", f"{MODELS / 'stack6.py'}:build",
              "--inputs", tmp_path / "small.safetensors", "--inputs", d / "in.safetensors", "--over", "inputs")
    assert res.report["bisect"]["failing_inputs"] == [1]
    assert res.code == 1


def _minilm(minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(minilm_dir), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(minilm_dir), local_files_only=True)
    return model, tok


def test_apply_policy_on_real_minilm(minilm_dir, tmp_path):
    """One Linear scaled to overflow fp16; bisect's policy keeps the fp16 run finite."""
    model, tok = _minilm(minilm_dir)
    target = "encoder.layer.2.output.dense"  # the FFN down-projection
    with torch.no_grad():
        model.get_submodule(target).weight.mul_(3000.0)
    d = tmp_path / "minilm-hot"
    d.mkdir()
    model.save_pretrained(str(d), safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (d / f).write_bytes((minilm_dir / f).read_bytes())
    rep = nan_hunter.bisect(str(d), dtype="fp16", prompts=["the quick brown fox jumps over the lazy dog"],
                            device="cpu", policy_out=str(tmp_path / "p.yaml"))
    b = rep.bisect
    assert b.finite_after, rep.notes
    assert target in b.keep_modules
    assert b.runs <= run_bound(b.candidates, len(b.keep_modules)) + 3
    # the public API on a fresh full-precision copy
    fresh, _ = _minilm(minilm_dir)
    fresh.load_state_dict(model.state_dict())
    enc = tok("the quick brown fox jumps over the lazy dog", return_tensors="pt")
    plain16 = type(fresh).from_pretrained(str(d), local_files_only=True).eval().half()
    with torch.no_grad():
        assert not torch.isfinite(plain16(**enc).last_hidden_state).all()
    handle = nan_hunter.apply_policy(fresh, str(tmp_path / "p.yaml"))
    try:
        with torch.no_grad():
            out = fresh(**enc).last_hidden_state
    finally:
        handle.remove()
    assert torch.isfinite(out).all()
    assert out.dtype == torch.float16
    assert not math.isnan(float(out.float().abs().max()))
