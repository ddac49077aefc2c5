"""The ``nanhunter`` entry point: usage errors in one line, and start-up that imports only what
the command needs (``nanhunter --help`` without torch; a weights-only scan without rich,
typer/pydantic, matplotlib or transformers)."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file

from nan_hunter import __version__


@pytest.mark.parametrize("args, says", [
    (["scan"], "the following arguments are required: checkpoint"),
    (["scan", "x.safetensors", "--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bisect", "x.safetensors", "--rtol", "abc"], "--rtol: invalid float value: 'abc'"),
    (["check"], "the following arguments are required: CHECKPOINT"),
    (["bisect", "x.safetensors", "--policy", "p.yaml"], "unrecognized arguments: --policy"),  # no abbreviations
])
def test_usage_errors_are_one_line(run_cli, args, says):
    code, out, err = run_cli(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nanhunter: error: ") and says in lines[0], err
    assert "--help" in lines[0] and out == ""


def test_version(run_cli):
    code, out, err = run_cli("--version")
    assert (code, out.strip(), err) == (0, f"nanhunter {__version__}", "")


def test_no_command_prints_help_and_exits_2(run_cli):
    code, out, err = run_cli()
    assert code == 2 and "scan" in err and "bisect" in err and "check" in err


@pytest.mark.parametrize("command", ["scan", "bisect", "check"])
def test_every_command_has_help(run_cli, command):
    code, out, _ = run_cli(command, "--help")
    assert code == 0 and out.startswith(f"usage: nanhunter {command}") and "--json" in out


def imported(run_cli, *args: object) -> set[str]:
    """Top-level packages a real ``nanhunter ARGS`` imported (``-X importtime`` through its
    environment variable); the command must succeed."""
    code, _, err = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert code == 0, err[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", err, flags=re.M)
    assert names, err[-2000:]
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["scan", "--help"]])
def test_help_imports_no_heavy_package(run_cli, args):
    mods = imported(run_cli, *args)
    assert not mods & {"torch", "rich", "yaml", "typer", "pydantic", "numpy"}, mods


def test_weights_only_scan_imports_only_what_it_needs(run_cli, tmp_path):
    save_file({"w": torch.ones(4)}, str(tmp_path / "w.safetensors"))
    mods = imported(run_cli, "scan", tmp_path / "w.safetensors", "--json", tmp_path / "r.json", "-q")
    assert "torch" in mods
    assert not mods & {"rich", "typer", "pydantic", "click", "matplotlib", "transformers"}, mods
