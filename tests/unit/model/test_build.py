"""nan_hunter/model/build.py: ``--arch`` factories loaded strictly from real safetensors files,
checkpoint code refused (``auto_map``), a tokenizer that needs code stands in refusing, and a
tiny Hugging Face directory built offline."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.model.build import (
    RefusedTokenizer,
    build_from_arch,
    build_from_hf,
    build_model,
    custom_code,
    load_factory,
    load_tokenizer,
)

ARCH = """
import sys
from torch import nn


def mlp():
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def not_a_module():
    return {"a": 1}


def broken():
    raise ValueError("bad width")


def leaves():
    sys.exit(0)
"""


@pytest.fixture
def arch(tmp_path):
    d = tmp_path / "code"
    d.mkdir()
    f = d / "arch.py"
    f.write_text(ARCH)
    return f


def weights(tmp_path, sd: dict, name: str = "w.safetensors"):
    f = tmp_path / name
    save_file({k: v.contiguous() for k, v in sd.items()}, str(f))
    return open_checkpoint(f)


def mlp_state(seed: int = 1) -> dict:
    torch.manual_seed(seed)
    from torch import nn

    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).state_dict()


# --- load_factory -------------------------------------------------------------------------------


def test_load_factory_from_a_file_writes_no_pycache(arch):
    fn = load_factory(f"{arch}:mlp")
    assert isinstance(fn(), torch.nn.Module)
    assert not (arch.parent / "__pycache__").exists()
    assert (
        str(arch.parent.resolve()) not in sys.path
    )  # the file's folder was on sys.path only while importing


def test_load_factory_from_a_package_module():
    fn = load_factory("models.training_nets:build_mlp")
    assert isinstance(fn(), torch.nn.Module)
    with pytest.raises(
        BadInput,
        match=r"cannot import no_such_pkg_x.mod \(ModuleNotFoundError: No module named 'no_such_pkg_x'\)",
    ):
        load_factory("no_such_pkg_x.mod:fn")


def test_load_factory_import_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('at import')\n")
    with pytest.raises(BadInput, match=r"importing .*bad.py raised RuntimeError: at import"):
        load_factory(f"{bad}:fn")
    ex = tmp_path / "ex.py"
    ex.write_text("import sys\nsys.exit(4)\n")
    with pytest.raises(BadInput, match=r"importing .*ex.py called sys.exit\(4\)"):
        load_factory(f"{ex}:fn")


# --- build_from_arch / load_strict --------------------------------------------------------------


def test_build_from_arch_loads_every_weight_strictly(arch, tmp_path):
    sd = mlp_state()
    ck = weights(tmp_path, sd)
    before = (tmp_path / "w.safetensors").read_bytes()
    m = build_from_arch(f"{arch}:mlp", ck)
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert (tmp_path / "w.safetensors").read_bytes() == before


def test_a_training_checkpoint_nested_under_a_prefix_loads(arch, tmp_path):
    sd = mlp_state()
    # keys outside the model's prefix (a step counter, optimizer state) are not the model's: ignored
    ck = weights(tmp_path, {f"model.{k}": v for k, v in sd.items()} | {"step_count": torch.ones(1)})
    m = build_from_arch(f"{arch}:mlp", ck)
    assert torch.equal(m[2].weight, sd["2.weight"]) and torch.equal(m[0].bias, sd["0.bias"])
    # an extra key under the prefix is the model's business: refused, named with its prefix
    ck = weights(
        tmp_path, {f"model.{k}": v for k, v in sd.items()} | {"model.extra": torch.ones(1)}, "x.safetensors"
    )
    with pytest.raises(BadInput, match=r"unexpected 1 keys \('model.extra'\)"):
        build_from_arch(f"{arch}:mlp", ck)


def test_missing_unexpected_and_misshapen_weights_are_refused(arch, tmp_path):
    sd = mlp_state()
    sd.pop("2.bias")
    sd["extra"] = torch.zeros(1)
    with pytest.raises(
        BadInput, match=r"missing 1 keys \('2.bias'\); unexpected 1 keys \('extra'\); check that --arch"
    ):
        build_from_arch(f"{arch}:mlp", weights(tmp_path, sd))
    sd = mlp_state()
    sd["0.weight"] = torch.zeros(5, 3)
    with pytest.raises(
        BadInput, match=r"'0.weight' has shape \[5, 3\] in the checkpoint, \[4, 3\] in the model"
    ):
        build_from_arch(f"{arch}:mlp", weights(tmp_path, sd, "shape.safetensors"))


@pytest.mark.parametrize(
    "fn, words",
    [
        ("not_a_module", "factory returned dict, not a torch.nn.Module"),
        ("broken", "factory raised ValueError: bad width"),
        (
            "leaves",
            "the factory called sys.exit(0); the factory must return an nn.Module, so nothing was scanned",
        ),
    ],
)
def test_bad_factories_are_one_line(arch, tmp_path, fn, words):
    with pytest.raises(BadInput) as e:
        build_from_arch(f"{arch}:{fn}", weights(tmp_path, mlp_state()))
    assert words in str(e.value) and "\n" not in str(e.value)


# --- custom code --------------------------------------------------------------------------------


def test_custom_code_finds_auto_map_entries(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": "tok.Tok", "AutoModel": "modeling.M"}})
    )
    assert custom_code(tmp_path) == "config.json auto_map AutoTokenizer → 'tok.Tok'"
    assert (
        custom_code(tmp_path, ("config.json",), ignore=("AutoTokenizer",))
        == "config.json auto_map AutoModel → 'modeling.M'"
    )
    assert custom_code(tmp_path, ("config.json",), keys=("AutoProcessor",)) is None
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": ["modeling.M"]}))
    assert custom_code(tmp_path) == "config.json auto_map → ['modeling.M']"
    (tmp_path / "config.json").write_text(json.dumps({"custom_pipelines": {"x": {}}}))
    assert custom_code(tmp_path) == "config.json custom_pipelines"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")  # not a mapping: nothing asked
    assert custom_code(tmp_path) is None


def test_refused_tokenizer_refuses_every_use_but_not_introspection():
    tok = RefusedTokenizer("needs its own code")
    with pytest.raises(BadInput, match="needs its own code"):
        tok("hello")
    with pytest.raises(BadInput, match="needs its own code"):
        _ = tok.pad_token_id
    assert not hasattr(tok, "__len__") and getattr(tok, "__wrapped__", None) is None


def hf_dir(tmp_path, **config):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
    return d


def test_a_checkpoint_asking_for_its_own_code_is_refused_before_transformers_runs(tmp_path):
    d = hf_dir(tmp_path, model_type="llama", auto_map={"AutoModelForCausalLM": "modeling_evil.Evil"})
    (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok.T", None]}}))
    ck = open_checkpoint(d)
    with pytest.raises(
        BadInput,
        match=r"ships custom code \(config.json auto_map AutoModelForCausalLM → "
        r"'modeling_evil.Evil'\) that nanhunter does not run; .*--arch",
    ):
        build_from_hf(ck)
    tok = load_tokenizer(ck)
    assert isinstance(tok, RefusedTokenizer)
    with pytest.raises(BadInput, match=r"tokenizer_config.json auto_map AutoTokenizer.*or pass --inputs"):
        tok("x")


# --- build_model --------------------------------------------------------------------------------


def test_build_model_weights_only_and_device_map_refusals(arch, tmp_path):
    ck = weights(tmp_path, mlp_state())
    assert build_model(ck, None) == (None, None, None)
    assert load_tokenizer(ck) is None
    m, tok, how = build_model(ck, f"{arch}:mlp")
    assert how == "arch" and tok is None and isinstance(m, torch.nn.Module)
    with pytest.raises(BadInput, match="--device-map auto needs a Hugging Face directory"):
        build_model(ck, f"{arch}:mlp", placed={"device_map": "auto"})


def test_a_tiny_llama_directory_is_built_offline_and_missing_weights_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    src = LlamaForCausalLM(cfg)
    d = tmp_path / "llama"
    src.save_pretrained(str(d), safe_serialization=True)
    m, tok, how = build_model(open_checkpoint(d), None)
    assert how == "hf" and tok is None and type(m).__name__ == "LlamaForCausalLM"
    for k, v in src.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    sd = {k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    with pytest.raises(
        BadInput,
        match=r"lacks 1 of the \d+ weights LlamaForCausalLM needs \('lm_head.weight'\); "
        r"transformers would fill them with random values",
    ):
        build_model(open_checkpoint(d), None)
