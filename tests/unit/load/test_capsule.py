"""nan_hunter/load/capsule.py: the capsule format written and read back, and its validation errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from nan_hunter.errors import BadInput
from nan_hunter.load.capsule import SCHEMA, is_capsule, read, write


def _write(tmp_path, **kw):
    ids = torch.tensor([[1, 2, 3]])
    args = dict(
        weights={"lin.weight": torch.ones(2, 2), "lin.bias": torch.zeros(2)},
        args=(torch.ones(1, 2), 3, object()),
        kwargs={"labels": ids, "input_ids": ids, "flag": True},
        meta={"phase": "backward", "dtype": "fp16", "arch": "m.py:build"},
    )
    args.update(kw)
    return write(tmp_path / "caps", 2, **args)


def test_write_then_read_round_trips(tmp_path):
    out = _write(tmp_path, grad_outputs=[("loss", torch.tensor(1.0))])
    assert out == tmp_path / "caps" / "step-2" and is_capsule(out)
    meta = json.loads((out / "capsule.json").read_text())
    assert meta["schema"] == SCHEMA and meta["step"] == 2 and meta["dtype"] == "fp16"
    assert meta["inputs"] == {
        "tensors": ["args.0", "input_ids", "labels"],
        "other": {"args.1": 3, "flag": True},
        "dropped": ["args.2"],
    }
    assert meta["files"] == ["model.safetensors", "inputs.safetensors", "grad_outputs.safetensors"]
    w = load_file(str(out / "model.safetensors"))
    assert torch.equal(w["lin.weight"], torch.ones(2, 2))
    ins = load_file(str(out / "inputs.safetensors"))  # labels and input_ids shared memory: stored twice
    assert torch.equal(ins["labels"], ins["input_ids"])
    cap = read(out)
    assert cap.phase == "backward" and cap.step == 2 and cap.files == meta["files"]


def test_optimizer_state_is_flattened_by_name(tmp_path):
    opt = {
        "grads": {"w": torch.ones(2)},
        "state": {"w": {"exp_avg": torch.zeros(2)}},
        "class": "Adam",
        "hyperparameters": [{"lr": 0.1}],
        "groups": {"w": 0},
    }
    out = _write(tmp_path, optimizer=opt, meta={"phase": "optimizer", "arch": "m.py:build"})
    flat = load_file(str(out / "optimizer.safetensors"))
    assert sorted(flat) == ["grad/w", "state/w/exp_avg"]
    meta = json.loads((out / "capsule.json").read_text())
    assert meta["optimizer"] == {"class": "Adam", "hyperparameters": [{"lr": 0.1}], "groups": {"w": 0}}


def test_an_existing_step_is_never_overwritten(tmp_path):
    out = _write(tmp_path)
    before = (out / "capsule.json").read_bytes()
    with pytest.raises(FileExistsError):
        _write(tmp_path)
    assert (out / "capsule.json").read_bytes() == before


def _edit(cap, **changes):
    meta = json.loads((cap / "capsule.json").read_text())
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    (cap / "capsule.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"schema": "other/v9"}, "not a nanhunter capsule"),
        ({"phase": "sideways"}, "is not forward, backward or optimizer"),
        ({"step": -1}, "non-negative integer"),
        ({"step": "2"}, "non-negative integer"),
        ({"arch": None}, "neither how to build the model"),
        ({"files": ["../model.safetensors"]}, "not a plain name"),
        ({"files": ["gone.safetensors"]}, "missing"),
    ],
)
def test_bad_capsule_json_is_bad_input(tmp_path, changes, words):
    cap = _write(tmp_path)
    _edit(cap, **changes)
    with pytest.raises(BadInput, match=words):
        read(cap)


def test_arch_given_needs_no_build_recipe_and_not_json_is_refused(tmp_path):
    cap = _write(tmp_path)
    _edit(cap, arch=None)
    assert read(cap, arch_given=True).phase == "backward"
    (cap / "capsule.json").write_text("{not json")
    with pytest.raises(BadInput):
        read(cap)
    assert not is_capsule(tmp_path)
