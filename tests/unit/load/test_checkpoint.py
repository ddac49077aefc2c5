"""nan_hunter/load/checkpoint.py: every checkpoint layout opened from real files in tmp_path."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import member, open_checkpoint, open_safetensors


def _save(path, tensors):
    save_file(tensors, str(path))
    return path


def test_single_file_names_tensors_and_owned_copies(tmp_path):
    f = _save(tmp_path / "m.safetensors", {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)})
    before = f.read_bytes()
    ck = open_checkpoint(f)
    assert ck.format == "safetensors" and sorted(ck.names()) == ["a", "b"]
    assert ck.n_tensors == 2 and ck.nbytes == (6 + 4) * 4
    t = ck.tensor("a")
    assert torch.equal(t, torch.arange(6.0).reshape(2, 3))
    t.fill_(7)  # an owned copy: the file is never touched
    assert f.read_bytes() == before and torch.equal(ck.tensor("a"), torch.arange(6.0).reshape(2, 3))
    assert ck.describe() == {"path": str(f), "format": "safetensors", "n_tensors": 2, "bytes": 40}


def test_scan_items_stream_every_tensor_with_its_metadata(tmp_path):
    bf = torch.tensor([1.5, -2.0, float("inf")], dtype=torch.bfloat16)
    f = _save(
        tmp_path / "m.safetensors",
        {"w": torch.full((3, 2), 2.0, dtype=torch.float16), "bf": bf, "ids": torch.arange(5)},
    )
    items, values = {}, {}
    for item in open_checkpoint(f).scan_items():  # each item's pieces are consumed before the next item
        items[item.name] = item
        if item.pieces is not None:
            pieces = [p for _, _, p in item.pieces]
            assert all(
                isinstance(p, np.ndarray) and not p.flags.writeable for p in pieces
            )  # read-only map views
            values[item.name] = np.concatenate(pieces)
    assert items["w"].dtype == "float16" and items["w"].shape == [3, 2] and items["w"].nbytes == 12
    assert items["w"].tag == "F16" and np.array_equal(values["w"], np.full(6, 2.0, dtype=np.float16))
    # bfloat16 has no numpy dtype: its pieces are its bits, the same bits torch holds
    assert items["bf"].dtype == "bfloat16" and items["bf"].tag == "BF16"
    assert np.array_equal(values["bf"], bf.view(torch.int16).numpy().view(np.uint16))
    assert items["ids"].dtype == "int64" and items["ids"].skip == "not floating point" and "ids" not in values


def test_sharded_index_and_hf_directory(tmp_path):
    _save(tmp_path / "s1.safetensors", {"a": torch.ones(2)})
    _save(tmp_path / "s2.safetensors", {"b": torch.zeros(3)})
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    ck = open_checkpoint(idx)
    assert ck.format == "sharded" and sorted(ck.names()) == ["a", "b"]
    assert torch.equal(ck.state_dict()["b"], torch.zeros(3))
    (tmp_path / "config.json").write_text("{}")
    d = open_checkpoint(tmp_path)
    assert d.format == "hf" and d.config_path == tmp_path / "config.json" and d.path == tmp_path


def test_directory_of_plain_files_and_torch_file(tmp_path):
    _save(tmp_path / "x.safetensors", {"x": torch.ones(1)})
    assert open_checkpoint(tmp_path).format == "safetensors"
    pt = tmp_path / "sd.pt"
    torch.save({"w": torch.full((2,), 3.0)}, pt)
    ck = open_checkpoint(pt)
    assert (
        ck.format == "torch" and ck.entry("w") is None and torch.equal(ck.tensor("w"), torch.full((2,), 3.0))
    )
    assert [i.name for i in ck.scan_items()] == ["w"]


@pytest.mark.parametrize(
    "name, words",
    [
        ("/etc/passwd", "absolute path"),
        ("../outside.safetensors", "climbs out"),
        ("", "not a file name"),
    ],
)
def test_member_confines_names_to_the_directory(tmp_path, name, words):
    with pytest.raises(BadInput, match=words):
        member(tmp_path, name, "index")


def test_member_refuses_a_symlink_out_and_accepts_one_inside(tmp_path):
    outside = tmp_path / "outside.safetensors"
    _save(outside, {"a": torch.ones(1)})
    root = tmp_path / "ck"
    root.mkdir()
    os.symlink(outside, root / "link.safetensors")
    with pytest.raises(BadInput, match="outside the checkpoint directory"):
        member(root, "link.safetensors", "index")
    _save(root / "real.safetensors", {"a": torch.ones(1)})
    os.symlink(root / "real.safetensors", root / "in.safetensors")
    shown, real = member(root, "in.safetensors", "index")
    assert shown == root / "in.safetensors" and real == (root / "real.safetensors").resolve()


def test_bad_layouts_are_bad_input(tmp_path):
    with pytest.raises(BadInput, match="checkpoint not found"):
        open_checkpoint(tmp_path / "none.safetensors")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInput, match="no \\*.safetensors"):
        open_checkpoint(empty)
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(BadInput, match="missing"):
        open_checkpoint(idx)
    idx.write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(BadInput, match="non-empty 'weight_map'"):
        open_checkpoint(idx)
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    with pytest.raises(BadInput, match="not a recognised checkpoint"):
        open_checkpoint(txt)


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    _save(tmp_path / "s1.safetensors", {"a": torch.ones(1)})
    _save(tmp_path / "s2.safetensors", {"a": torch.ones(1)})
    with pytest.raises(BadInput, match="appears in both"):
        open_checkpoint(tmp_path)


def test_a_capsule_directory_is_pointed_to_scan(tmp_path):
    (tmp_path / "capsule.json").write_text("{}")
    _save(tmp_path / "model.safetensors", {"a": torch.ones(1)})
    with pytest.raises(BadInput, match="nanhunter capsule"):
        open_checkpoint(tmp_path)


def test_a_fifo_in_a_directory_is_refused(tmp_path):
    _save(tmp_path / "m.safetensors", {"a": torch.ones(1)})
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(BadInput, match="not a regular file"):
        open_checkpoint(tmp_path)


def test_open_safetensors_names_what_it_reads(tmp_path):
    bad = tmp_path / "inputs.safetensors"
    bad.write_bytes(b"abc")
    with pytest.raises(BadInput, match="too short"):
        open_safetensors(bad, "--inputs")
