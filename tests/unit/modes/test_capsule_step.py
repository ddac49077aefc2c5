"""nan_hunter/modes/capsule_step.py, rebuilding a capsule's model: from ``--arch`` or the
capsule's transformers config, weights strict and in the dtypes they were stored in; autocast
entries and the checkpoint description. (Re-running capsules: tests/integration/test_capsule.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from nan_hunter.errors import BadInput
from nan_hunter.load.capsule import Capsule
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.modes.capsule_step import (
    _autocast,
    _from_config,
    _match_dtypes,
    _strict_keys,
    build,
    describe,
)

LLAMA = {
    "model_type": "llama",
    "vocab_size": 16,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
}


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.norm = nn.LayerNorm(2)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))


def capsule(tmp_path, meta: dict, tensors: dict) -> tuple[Capsule, object]:
    d = tmp_path / "step-3"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "capsule.json").write_text(json.dumps(meta))
    return Capsule(d, meta, ["model.safetensors"]), open_checkpoint(d / "model.safetensors")


def test_autocast_entries(tmp_path):
    assert _autocast(None, tmp_path) == []
    assert _autocast([["cpu", "bf16"], ["cpu", "float16"]], tmp_path) == [
        ("cpu", torch.bfloat16),
        ("cpu", torch.float16),
    ]
    for bad in (["tpu", "bf16"], ["cpu"], "cpu", ["cpu", 16]):
        with pytest.raises(
            BadInput, match="autocast entries must be \\[device, dtype\\] with device cpu or cuda"
        ):
            _autocast([bad], tmp_path)
    with pytest.raises(BadInput, match="autocast dtype 'fp12' is not a dtype nanhunter knows"):
        _autocast([["cpu", "fp12"]], tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(
            BadInput, match="ran under CUDA autocast; re-run the capsule on a machine with a CUDA"
        ):
            _autocast([["cuda", "fp16"]], tmp_path)


def test_match_dtypes_follows_each_stored_tensor(tmp_path):
    m = Mixed()
    stored = {
        "lin.weight": torch.ones(2, 2, dtype=torch.float16),
        "lin.bias": torch.ones(2, dtype=torch.float16),
        "norm.weight": torch.ones(2),
        "norm.bias": torch.ones(2, dtype=torch.bfloat16),
        "count": torch.zeros((), dtype=torch.int64),
    }
    _, ck = capsule(tmp_path, {}, stored)
    _match_dtypes(m, ck)
    got = {k: v.dtype for k, v in m.state_dict().items()}
    assert got == {k: v.dtype for k, v in stored.items()}


def test_match_dtypes_casts_tied_weights_once(tmp_path):
    m = nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 4, bias=False))
    m[1].weight = m[0].weight  # tied
    _, ck = capsule(tmp_path, {}, {"0.weight": torch.ones(4, 2, dtype=torch.float16)})
    _match_dtypes(m, ck)
    assert m[0].weight is m[1].weight and m[1].weight.dtype == torch.float16


def test_strict_keys_names_the_model_class_and_the_keys(tmp_path):
    cap, ck = capsule(
        tmp_path, {"model_class": "Mixed"}, {"lin.weight": torch.ones(2, 2), "extra": torch.ones(1)}
    )
    with pytest.raises(BadInput) as e:
        _strict_keys(Mixed(), ck, cap)
    msg = str(e.value)
    assert "weights do not match the Mixed built from the capsule's config: missing 4 keys (" in msg
    assert "unexpected 1 keys ('extra')" in msg and msg.endswith(
        "pass --arch file.py:factory for the model this capsule came from"
    )


def test_from_config_refusals(tmp_path):
    cap = Capsule(
        tmp_path, {"config": {**LLAMA, "auto_map": {"AutoModel": "m.M"}}, "model_class": "LlamaModel"}
    )
    with pytest.raises(BadInput, match=r"asks for its own code \(auto_map\)"):
        _from_config(cap)
    for name, words in (
        ("os.system", "is not a transformers class name"),
        (None, "is not a transformers class name"),
        ("AutoTokenizer", "is not a model class of transformers"),
    ):
        with pytest.raises(BadInput, match=words):
            _from_config(Capsule(tmp_path, {"config": LLAMA, "model_class": name}))


def test_build_from_the_capsules_config_is_bit_exact_in_the_stored_dtypes(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    src = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})).half()
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    meta = {
        "model_class": "LlamaForCausalLM",
        "config": LLAMA,
        "phase": "forward",
        "step": 3,
        "dtype": "fp16",
    }
    cap, ck = capsule(tmp_path, meta, sd)
    model, how = build(cap, ck, None, torch.device("cpu"))
    assert how == "config" and type(model).__name__ == "LlamaForCausalLM"
    for k, v in model.state_dict().items():
        assert v.dtype == torch.float16 and torch.equal(v, sd[k]), k
    d = describe(cap, ck)
    assert d["format"] == "capsule" and d["n_tensors"] == len(sd)
    assert d["capsule"]["step"] == 3 and d["capsule"]["model_class"] == "LlamaForCausalLM"
    assert d["capsule"]["files"] == ["model.safetensors"] and d["capsule"]["optimizer"] is None
