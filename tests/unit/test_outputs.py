"""``nan_hunter.outputs`` on its own: the output checks as a table, and atomic writes under
injected failures (a full disk, Ctrl-C mid-write)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from nan_hunter import outputs
from nan_hunter.errors import BadInput
from nan_hunter.load import command_inputs
from nan_hunter.load.command_inputs import input_files
from nan_hunter.outputs import Output, check_outputs


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"weights")
    (ck / "config.json").write_text("{}")
    sharded = tmp_path / "sharded"
    (sharded / "sub").mkdir(parents=True)
    (sharded / "sub" / "s1.safetensors").write_bytes(b"shard")
    (sharded / "m.safetensors.index.json").write_text('{"weight_map": {"a": "sub/s1.safetensors"}}')
    (tmp_path / "in.safetensors").write_bytes(b"inputs")
    (tmp_path / "arch.py").write_text("def build(): ...\n")
    os.link(ck / "model.safetensors", tmp_path / "hard.json")
    (tmp_path / "sym.json").symlink_to(ck / "config.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "new-target.json")
    os.mkfifo(tmp_path / "fifo")
    return {"tmp": tmp_path, "ck": ck, "sharded": sharded}


def refused(outs: list[Output], inputs: list[Path]) -> str | None:
    try:
        check_outputs(outs, inputs)
    except BadInput as e:
        return str(e)
    return None


CASES = [
    # (outputs as (flag, path relative to tmp or "-"), what the message must say, or None when accepted)
    ([("--json", "ck/model.safetensors")], "is an input"),
    ([("--json", "ck/config.json")], "is an input"),
    ([("--json", "ck")], "is a directory"),
    ([("--json", "hard.json")], "is an input"),
    ([("--policy-out", "sym.json")], "is an input"),
    ([("--json", "in.safetensors")], "is an input"),
    ([("--json", "arch.py")], "is an input"),
    ([("--json", "sharded/sub/s1.safetensors")], "is an input"),
    ([("--json", "fifo")], "not a regular file"),
    ([("--json", "missing/r.json")], "does not exist"),
    ([("--json", "-"), ("--policy-out", "-")], "only one output can go to stdout"),
    ([("--json", "r.json"), ("--junit", "r.json")], "same file as --json"),
    ([("--json", "r.json"), ("--junit", "./r.json")], "same file as --json"),
    ([("--json", "new-target.json"), ("--junit", "dangling.json")], "same file as --json"),
    ([("--json", "ck/report.json")], None),  # a new file beside the checkpoint is not an input
    ([("--json", "dangling.json")], None),
    ([("--json", "-"), ("--junit", "j.xml")], None),
    ([("--json", os.devnull)], None),
]


@pytest.mark.parametrize("outs, says", CASES, ids=[" ".join(f"{f} {p}" for f, p in c[0]) for c in CASES])
def test_output_checks(files, outs, says):
    tmp = files["tmp"]
    inputs = input_files(
        [str(files["ck"]), str(files["sharded"] / "m.safetensors.index.json")],
        inputs=[str(tmp / "in.safetensors")],
        arch=f"{tmp / 'arch.py'}:build",
    )
    resolved = [Output(f, p if p in ("-", os.devnull) else str(tmp / p)) for f, p in outs]
    msg = refused(resolved, inputs)
    if says is None:
        assert msg is None
    else:
        assert msg is not None and says in msg and resolved[0].flag in msg


def test_packaged_configs_are_inputs():
    default = Path(outputs.__file__).parent / "configs" / "default.yaml"
    assert default in input_files()
    with pytest.raises(BadInput, match="is an input"):
        check_outputs([Output("--json", str(default))], input_files())


def test_report_outputs_include_markdown_pngs_and_refuse_stdout(tmp_path):
    assert [o.path for o in outputs.report_outputs(str(tmp_path / "r.md"), 2)] == [
        str(tmp_path / "r.md"),
        str(tmp_path / "r-1.png"),
        str(tmp_path / "r-2.png"),
    ]
    assert [o.path for o in outputs.report_outputs(str(tmp_path / "r.html"))] == [str(tmp_path / "r.html")]
    with pytest.raises(BadInput, match="--report"):
        outputs.report_outputs("-")
    with pytest.raises(BadInput, match="cannot go to stdout"):
        check_outputs([Output("--report", "-", text=False)])


def test_arch_file_of_a_spec():
    assert command_inputs.arch_file("models/m.py:build") == Path("models/m.py")
    assert command_inputs.arch_file("pkg.module:build") is None
    assert command_inputs.arch_file(None) is None


def test_write_replaces_atomically_and_keeps_mode(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    target.chmod(0o640)
    outputs.write_text("--json", str(target), "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert list(tmp_path.iterdir()) == [target]


def test_new_file_gets_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        outputs.write_text("--json", str(tmp_path / "r.json"), "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("existing", [False, True])
def test_failed_write_leaves_nothing(tmp_path, monkeypatch, existing):
    target = tmp_path / "r.json"
    if existing:
        target.write_text("old")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs.os, "fsync", full_disk)
    with pytest.raises(BadInput, match=r"--json .*r\.json: cannot write \(No space left on device\)"):
        outputs.write_text("--json", str(target), "new")
    assert [p.name for p in tmp_path.iterdir()] == (["r.json"] if existing else [])
    if existing:
        assert target.read_text() == "old"
    assert outputs._temporaries == set()


def test_interrupt_mid_write_removes_the_temporary(tmp_path, monkeypatch):
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        outputs.write_bytes("--report", str(tmp_path / "r.html"), b"<html>")
    assert list(tmp_path.iterdir()) == [] and outputs._temporaries == set()


def test_remove_temporaries(tmp_path):
    tmp = tmp_path / ".r.json.x.nanhunter-tmp"
    tmp.write_text("partial")
    outputs._temporaries.add(str(tmp))
    outputs.remove_temporaries()
    assert not tmp.exists() and outputs._temporaries == set()


def test_stdout_output(capfdbinary):
    outputs.write_text("--json", "-", "{}\n")
    assert capfdbinary.readouterr().out == b"{}\n"
