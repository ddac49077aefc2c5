"""nan_hunter/load/torch_checkpoint.py: torch files read with weights_only=True only, nested
training checkpoints named by dotted path, refusals in one line."""

from __future__ import annotations

import pickle

import pytest
import torch

from nan_hunter.errors import BadInput
from nan_hunter.load import torch_checkpoint
from nan_hunter.load.torch_checkpoint import MAX_NESTING, load_torch_file, tensors_by_path


class Evil:
    """Pickled as a call to ``print``: weights_only must refuse it, never run it."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_a_training_checkpoint_is_named_by_dotted_paths_in_saved_order(tmp_path):
    ck = {
        "model": {"fc.weight": torch.ones(2, 2), "fc.bias": torch.zeros(2)},
        "optimizer": {
            "state": {0: {"exp_avg": torch.full((2,), 3.0), "step": torch.tensor(4.0)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "ema": [torch.ones(1), (torch.zeros(1),)],
        "epoch": 3,
        "name": "run",
    }
    f = tmp_path / "train.pt"
    torch.save(ck, f)
    before = f.read_bytes()
    got = load_torch_file(f)
    assert list(got) == [
        "model.fc.weight",
        "model.fc.bias",
        "optimizer.state.0.exp_avg",
        "optimizer.state.0.step",
        "ema.0",
        "ema.1.0",
    ]
    assert torch.equal(got["optimizer.state.0.exp_avg"], torch.full((2,), 3.0))
    assert f.read_bytes() == before


def test_a_bare_tensor_and_a_legacy_non_zip_file(tmp_path):
    f = tmp_path / "t.pt"
    torch.save(torch.arange(3.0), f)
    assert list(load_torch_file(f)) == ["tensor"]
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert torch.equal(load_torch_file(legacy)["w"], torch.ones(2))


def test_pickled_code_is_refused_without_running(tmp_path, capsys):
    f = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(1), "x": Evil()}, f)
    with pytest.raises(
        BadInput,
        match=r"cannot be loaded with torch.load\(weights_only=True\) .*never unpickles "
        r"arbitrary code: convert it to safetensors",
    ) as e:
        load_torch_file(f)
    assert "\n" not in str(e.value)
    assert "unpickled!" not in capsys.readouterr().out
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(BadInput, match="weights_only=True"):
        load_torch_file(plain)
    assert "unpickled!" not in capsys.readouterr().out


def test_files_without_tensors_or_of_the_wrong_shape_are_refused(tmp_path):
    f = tmp_path / "n.pt"
    torch.save(7, f)
    with pytest.raises(BadInput, match="expected a state dict .*got int"):
        load_torch_file(f)
    torch.save({"epoch": 3, "cfg": {"lr": 0.1}}, f)
    with pytest.raises(BadInput, match="holds no tensors"):
        load_torch_file(f)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(BadInput, match="cannot be loaded"):
        load_torch_file(tmp_path / "junk.pt")
    with pytest.raises(BadInput, match="not found"):
        load_torch_file(tmp_path / "missing.pt")


def test_tensors_by_path_refuses_clashing_names_deep_nesting_and_too_many(monkeypatch):
    with pytest.raises(BadInput, match="two tensors are both named 'a.b' by their path"):
        tensors_by_path({"a": {"b": torch.ones(1)}, "a.b": torch.ones(1)}, "f.pt")
    deep: object = torch.ones(1)
    for _ in range(MAX_NESTING + 1):
        deep = [deep]
    with pytest.raises(BadInput, match=f"nested deeper than {MAX_NESTING} levels"):
        tensors_by_path(deep, "f.pt")
    ok: object = torch.ones(1)
    for _ in range(MAX_NESTING):
        ok = [ok]
    assert list(tensors_by_path(ok, "f.pt")) == [".".join(["0"] * MAX_NESTING)]
    monkeypatch.setattr(torch_checkpoint, "MAX_TENSORS", 3)
    with pytest.raises(BadInput, match="more than 3 tensors"):
        tensors_by_path([torch.ones(1)] * 4, "f.pt")
