"""Fuzz the sharded index's values and shard names (issue 25): every malformed ``weight_map``
entry — a value that is not a file name, a shard name with a NUL byte, a component over the
file system's 255 bytes, a path over PATH_MAX, a directory, the index itself — ends in exit 2
with one line (``BadInput``), or a normal scan; never another exception. Seeded; the fixed
cases run first, then random combinations.

The output-path check reads the index before the loader does (it protects the shards from being
overwritten): it uses the loader's parser (``load.checkpoint.read_index``), so the same cases end
the same way there too, and the real command says so in one line (issue 32: a list value and a
NUL byte were internal errors, exit 3)."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from safetensors.torch import save_file

import nan_hunter
from nan_hunter import outputs
from nan_hunter.errors import BadInput
from nan_hunter.load import command_inputs

SEED = 2525
N_RANDOM = 60

FIXED_VALUES = [
    ["shard-1.safetensors"],
    {"f": "shard-1.safetensors"},
    5,
    1.5,
    True,
    None,
    "",
    "shard-1.safetensors\x00x",
    "\x00",
    "a" * 300,
    "a" * 300 + ".safetensors",
    "sub/" + "b" * 256,
    "a/" * 2100 + "x.safetensors",
    "x" * 5000,
    "sub",
    "sub/",
    ".",
    "./",
    "shard-1.safetensors/",
    "model.safetensors.index.json",
    "config.txt",
    "shard-1.safetensors\n",
    " shard-1.safetensors",
    "shard-\ud800.safetensors",
    "shard-1.safetensors\\..\\x",
    "\u202eshard.safetensors",
    "fifo.safetensors",
    "missing.safetensors",
    "bad\nname.safetensors",
    "sub/../shard-1.safetensors",
    "//shard-1.safetensors",
    "~/shard-1.safetensors",
]
FIXED_KEYS = ["", "\x00", "k" * 300, "w\nx", "\ud800"]


def _case(tmp_path, i: int, weight_map: object, as_dir: bool):
    d = tmp_path / f"c{i}"
    d.mkdir()
    (d / "sub").mkdir()
    save_file({"w": torch.ones(3)}, str(d / "shard-1.safetensors"))
    save_file({"v": torch.ones(2)}, str(d / "shard-2.safetensors"))
    (d / "config.txt").write_text("not a shard")
    (d / "bad\nname.safetensors").write_bytes(
        b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage"
    )  # a real, corrupt shard
    os.mkfifo(d / "fifo.safetensors.pipe")
    try:
        os.symlink("fifo.safetensors.pipe", d / "fifo.safetensors")
    except OSError:
        pass
    text = json.dumps({"metadata": {}, "weight_map": weight_map}, ensure_ascii=True)
    (d / "model.safetensors.index.json").write_text(text)
    return d if as_dir else d / "model.safetensors.index.json"


def _outcome(path) -> object:
    try:
        return nan_hunter.scan(str(path)).exit_code()
    except BadInput as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, msg
        return 2


@pytest.mark.parametrize("as_dir", [False, True])
def test_fixed_malformed_values_exit_2_one_line(tmp_path, as_dir):
    for i, v in enumerate(FIXED_VALUES):
        got = _outcome(_case(tmp_path, i, {"w": "shard-1.safetensors", "v": v}, as_dir))
        assert got == 2, (v, got)
    for j, k in enumerate(FIXED_KEYS):
        got = _outcome(
            _case(tmp_path, 100 + j, {"w": "shard-1.safetensors", k: "shard-2.safetensors"}, as_dir)
        )
        assert got == 2, (k, got)


def test_random_index_values(tmp_path):
    rng = random.Random(SEED)
    pool = FIXED_VALUES + ["shard-1.safetensors", "shard-2.safetensors"]
    for i in range(N_RANDOM):
        wm: dict = {}
        for _ in range(rng.randrange(1, 4)):
            wm[rng.choice(["w", "v", "x"] + FIXED_KEYS)] = rng.choice(pool)
        if rng.random() < 0.2:
            wm = rng.choice([[], "weights", 3, None, [["w", "shard-1.safetensors"]]])
        got = _outcome(_case(tmp_path, i, wm, rng.random() < 0.5))
        assert got in (0, 1, 2), (wm, got)


def _guard_outcome(path) -> object:
    """What the output check (run before any work) makes of the checkpoint: its files, or exit 2."""
    try:
        outputs.check_outputs(
            [outputs.Output("--json", str(path.parent / "out.json"))], command_inputs.input_files([str(path)])
        )
        return 0
    except BadInput as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, msg
        return 2


@pytest.mark.parametrize("as_dir", [False, True])
def test_output_check_reads_the_index_as_the_loader_does(tmp_path, as_dir):
    for i, v in enumerate(FIXED_VALUES):
        path = _case(tmp_path, i, {"w": "shard-1.safetensors", "v": v}, as_dir)
        guard, scan = _guard_outcome(path), _outcome(path)
        assert scan == 2 and guard in (0, 2), (v, guard)
    rng = random.Random(SEED + 1)
    for i in range(N_RANDOM // 2):
        wm = {rng.choice(["w", "v"] + FIXED_KEYS): rng.choice(FIXED_VALUES + ["shard-1.safetensors"])}
        _guard_outcome(_case(tmp_path, 200 + i, wm, as_dir))  # BadInput or the files: never another error


@pytest.mark.parametrize(
    "value, says",
    [(["shard-1.safetensors"], "not a file name"), ("shard-1.safetensors\x00x", "is not a file name")],
)
@pytest.mark.parametrize("as_dir", [False, True])
def test_malformed_index_exits_2_in_one_line_from_the_cli(run_main, tmp_path, value, says, as_dir):
    path = _case(tmp_path, 0, {"w": value}, as_dir)
    for extra in ([], ["--json", str(tmp_path / "r.json")]):
        res = run_main("scan", path, *extra)
        lines = res.stderr.strip().splitlines()
        assert res.code == 2 and len(lines) == 1 and says in lines[0] and "internal error" not in lines[0], (
            res.stderr
        )
        assert "model.safetensors.index.json" in lines[0]
