"""The ``nanhunter`` entry point: usage errors in one line, ``--version`` for bug reports, and
start-up that imports only what the command needs (``nanhunter --help`` without torch; a
weights-only scan without rich, pydantic, matplotlib or transformers). How long ``--help`` takes is
measured by ``bench/help_time.py`` (a speed target is a benchmark's, not a timed test's).

What the command says runs in this process (``invoke``); a real process where it is the point: a
closed pipe, what start-up imports (tests/integration/test_bad_input.py has exit 2 from the
console script)."""

from __future__ import annotations

import re
import sys

import pytest
import torch
from clirun import invoke
from safetensors.torch import save_file

from nan_hunter import __version__


@pytest.mark.parametrize("args, says", [
    (["scan"], "the following arguments are required: checkpoint"),
    (["scan", "x.safetensors", "--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bisect", "x.safetensors", "--rtol", "abc"], "--rtol: invalid float value: 'abc'"),
    (["scan", "x.safetensors", "--generate", "1.5"], "argument --generate: invalid int value: '1.5'"),
    (["check"], "the following arguments are required: CHECKPOINT"),
    (["diff"], "the following arguments are required: A, B"),
    (["bisect", "x.safetensors", "--policy", "p.yaml"], "unrecognized arguments: --policy"),  # no abbreviations
    (["scan", "x.safetensors", "--dtype"], "argument --dtype: expected one argument"),
    (["scan", "x.safetensors", "--quiet=yes"], "argument --quiet: ignored explicit argument 'yes'"),
    (["scan", "x.safetensors", "y.safetensors"], "unrecognized arguments: y.safetensors"),
])
def test_usage_errors_are_one_line(args, says):
    code, out, err = invoke(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nanhunter: error: ") and says in lines[0], err
    assert "--help" in lines[0] and out == ""


def test_version_names_what_a_bug_report_needs():
    code, out, err = invoke("--version")
    lines = out.splitlines()
    assert code == 0 and err == "" and lines[0].split() == ["nanhunter", __version__]
    names = [line.split()[0] for line in lines]
    assert names == ["nanhunter", "Python", "torch", "transformers", "accelerate", "lightning", "triton", "safetensors"]
    torch_line = lines[2]
    assert torch.__version__ in torch_line and "device:" in torch_line
    assert ("CUDA" in torch_line or "ROCm" in torch_line) if torch.cuda.is_available() else "CPU only" in torch_line
    assert sys.version.split()[0] in lines[1]


def test_version_says_absent_libraries_are_absent(monkeypatch):
    from importlib import metadata

    from nan_hunter.cli import about

    real = metadata.version

    def version(dist):
        if dist in ("triton", "lightning", "pytorch-lightning"):
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(metadata, "version", version)
    lines = {line.split()[0]: line for line in about.version_lines()}
    assert lines["triton"].split(None, 1)[1] == "not installed"
    assert lines["lightning"].split(None, 1)[1] == "not installed"


def test_no_command_prints_help_and_exits_2():
    code, out, err = invoke()
    assert code == 2 and "scan" in err and "bisect" in err and "check" in err


@pytest.mark.parametrize("command", ["scan", "bisect", "check", "diff"])
def test_every_command_has_help(command):
    code, out, _ = invoke(command, "--help")
    assert code == 0 and f"Usage: nanhunter {command}" in out and "--json" in out


def test_help_into_a_closed_pipe_is_not_an_error(run_cli):
    res = run_cli("scan", "--help", reader_leaves_after=1)
    assert res.code == 0 and res.stderr == ""


def imported(run_cli, *args: object) -> set[str]:
    """Top-level packages a real ``nanhunter ARGS`` imported (``-X importtime`` through its
    environment variable); the command must succeed."""
    code, _, err = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert code == 0, err[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", err, flags=re.M)
    assert names, err[-2000:]
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("args", [["--help"], ["scan", "--help"], ["check", "--help"]])
def test_help_imports_no_heavy_package(run_cli, args):
    mods = imported(run_cli, *args)
    assert "typer" in mods and "rich" in mods  # the help is typer's, drawn with rich
    assert not mods & {"torch", "yaml", "pydantic", "numpy", "safetensors"}, mods


def test_version_imports_torch_but_not_the_libraries_it_names(run_cli):
    mods = imported(run_cli, "--version")
    assert "torch" in mods and not mods & {"transformers", "lightning", "accelerate", "rich"}, mods


def test_weights_only_scan_imports_only_what_it_needs(run_cli, tmp_path):
    save_file({"w": torch.ones(4)}, str(tmp_path / "w.safetensors"))
    mods = imported(run_cli, "scan", tmp_path / "w.safetensors", "--json", tmp_path / "r.json", "-q")
    assert "torch" in mods and "typer" in mods  # typer parses the command line
    assert not mods & {"rich", "pydantic", "matplotlib", "transformers"}, mods
