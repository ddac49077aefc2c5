"""Quantized model directories always get an answer (issue 48, item 2): a real bitsandbytes directory
(transformers ``save_pretrained`` of a 4-bit or 8-bit Llama quantized by bitsandbytes on CPU) is scanned
and checked with ``--prompt``: the weights verdict is printed and the forward runs in the model's own
quantized form (it exited 3 before: ``You cannot cast a bitsandbytes model in a new dtype``). GPTQ and
AWQ directories without their kernel packages: the weights verdict and one line saying why nothing ran,
never exit 2."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from clirun import invoke

torch = pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "examples" / "tiny-llama-fp16"
QUANT = ROOT / "tests" / "data" / "quant"


def _bnb_dir(root: Path, kind: str) -> Path:
    """A tiny Llama saved by transformers after bitsandbytes quantized it on CPU (``kind``: nf4, fp4, int8),
    with the example tokenizer."""
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    plain = root / "plain"
    if not plain.exists():
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
        )
        LlamaForCausalLM(cfg).save_pretrained(plain)
    qc = (
        BitsAndBytesConfig(load_in_8bit=True)
        if kind == "int8"
        else BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind)
    )
    model = LlamaForCausalLM.from_pretrained(plain, quantization_config=qc, device_map="cpu")
    out = root / kind
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / f, out / f)
    return out


@pytest.fixture(scope="module")
def bnb_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bnb")
    return {kind: _bnb_dir(root, kind) for kind in ("nf4", "fp4", "int8")}


def _plant_nan_scale(src: Path, dst: Path) -> str:
    """A copy of ``src`` with one NaN in the first absmax (4-bit) or SCB (int8) tensor; its name."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    name = next(n for n in sorted(sd) if n.endswith((".absmax", ".SCB")) and sd[n].is_floating_point())
    sd[name] = sd[name].clone()
    sd[name].view(-1)[0] = math.nan
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("kind", ["nf4", "fp4", "int8"])
def test_a_clean_bitsandbytes_dir_is_scanned_and_checked_in_its_own_form(bnb_dirs, kind, tmp_path):
    d = bnb_dirs[kind]
    r = invoke("scan", d, "--prompt", "hello world", "--json", tmp_path / "s.json")
    assert r.code == 0, r.stderr
    rep = json.loads((tmp_path / "s.json").read_text())
    assert rep["run"]["quantized"] == "bitsandbytes" and rep["run"]["n_inputs"] == 1
    assert rep["weights"]["quantized"] and rep["diagnosis"] is None
    r = invoke("check", d, "--prompt", "hello world", "--dtypes", "fp16,bf16", "--json", tmp_path / "c.json")
    assert r.code == 0, r.stderr
    rep = json.loads((tmp_path / "c.json").read_text())
    rules = {x["rule"]: x["status"] for x in rep["check"]["results"]}
    ran = rep["run"]["dtype"]
    assert rules[f"forward.{ran}.nonfinite"] == "pass" and rules["weights.quantized"] == "pass"
    assert any("ran once, in its own quantized form" in n for n in rep["notes"])
    assert invoke("check", d).code == 0  # no prompt: the weights verdict alone


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_a_nan_scale_in_a_bitsandbytes_dir_is_found_with_or_without_a_prompt(bnb_dirs, kind, tmp_path):
    name = _plant_nan_scale(bnb_dirs[kind], tmp_path / "bad")
    for extra in ([], ["--prompt", "hello world"]):
        r = invoke("scan", tmp_path / "bad", *extra, "--json", tmp_path / "s.json")
        assert r.code == 1, r.stderr
        rep = json.loads((tmp_path / "s.json").read_text())
        assert any(
            q["scale"] == name and q["bad_blocks"][0]["problem"] == "nan" for q in rep["weights"]["quantized"]
        )
        r = invoke("check", tmp_path / "bad", *extra, "--json", tmp_path / "c.json")
        assert r.code == 1, r.stderr
        rules = {
            x["rule"]: x["status"] for x in json.loads((tmp_path / "c.json").read_text())["check"]["results"]
        }
        assert rules["weights.quantized"] == "fail"


@pytest.mark.parametrize("fixture", ["gptq_4bit_sym_v1", "awq_gemm"])
def test_gptq_and_awq_dirs_without_their_kernels_get_the_weights_verdict(fixture, tmp_path):
    """The fixtures are written by the reference packers (``tests/data/quant/make_fixtures.py``); this
    machine has no optimum/gptqmodel, so transformers cannot build them."""
    d = tmp_path / fixture
    shutil.copytree(QUANT / fixture, d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / f, d / f)
    for cmd in ("scan", "check"):
        r = invoke(cmd, d, "--prompt", "hello", "--json", tmp_path / f"{cmd}.json")
        assert r.code == 0, r.stderr
        rep = json.loads((tmp_path / f"{cmd}.json").read_text())
        notes = [n for n in rep["notes"] if "not built" in n or "forward not run" in n]
        assert len(notes) == 1 and "could not build" in notes[0], rep["notes"]
        assert rep["weights"]["quantized"][0]["format"] in ("gptq", "awq")
