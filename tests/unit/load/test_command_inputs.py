"""load/command_inputs.py: every file a command reads, so no output may overwrite one — the
checkpoint, an index and the shards it names (read by the loader's own parser: a malformed index is
refused here as the loader would), every file of a model directory, --inputs/--data/--config/--arch
files and the packaged configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nan_hunter.errors import BadInput
from nan_hunter.load.command_inputs import arch_file, checkpoint_files, input_files

CONFIGS = Path(__file__).resolve().parents[3] / "nan_hunter" / "configs"


@pytest.mark.parametrize(
    "spec, path",
    [
        (None, None),
        ("", None),
        ("model.py:build", Path("model.py")),
        ("dir/model:build", Path("dir/model")),
        ("package.module:build", None),  # imported, not a file
        ("model.py", None),  # no factory: refused elsewhere
    ],
)
def test_arch_file(spec, path):
    assert arch_file(spec) == path


def test_a_file_and_an_index(tmp_path):
    (tmp_path / "s1.safetensors").write_bytes(b"x")
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    assert checkpoint_files(tmp_path / "s1.safetensors") == [tmp_path / "s1.safetensors"]
    assert sorted(checkpoint_files(idx)) == sorted(
        [idx, tmp_path / "s1.safetensors", tmp_path / "s2.safetensors"]
    )


def test_a_directory_every_file_and_the_shards_its_indexes_name(tmp_path):
    d = tmp_path / "ck"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "sub/s1.safetensors"}}))
    (d / "pytorch_model.bin.index.json").write_text("not json")  # not the loader's to read: left alone
    files = checkpoint_files(d)
    assert d / "sub" / "s1.safetensors" in files and d / "config.json" in files
    assert d / "pytorch_model.bin.index.json" in files


def test_a_malformed_safetensors_index_is_refused_as_the_loader_would(tmp_path):
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "../escape.safetensors"}}))
    with pytest.raises(BadInput, match="'..'"):
        checkpoint_files(idx)


def test_a_missing_path_reads_nothing_else(tmp_path):
    assert checkpoint_files(tmp_path / "nope.safetensors.index.json") == [
        tmp_path / "nope.safetensors.index.json"
    ]


def test_input_files(tmp_path):
    files = input_files(
        [str(tmp_path / "m.safetensors")],
        inputs=["a.safetensors"],
        data="d.jsonl",
        config="c.yaml",
        arch="model.py:build",
    )
    assert set(CONFIGS.glob("*.yaml")) <= set(files) and set(CONFIGS.glob("*.yaml"))
    assert {
        tmp_path / "m.safetensors",
        Path("a.safetensors"),
        Path("d.jsonl"),
        Path("c.yaml"),
        Path("model.py"),
    } <= set(files)
    assert set(input_files()) == set(CONFIGS.glob("*.yaml"))
