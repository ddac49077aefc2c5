"""Every ``nanhunter`` command in README.md's shell blocks is run (in-process, ``cli.main.main``,
from a scratch directory so outputs land there) and exits as its ``# exit N`` comment says.
Commands on placeholder paths (``./model``, ``ckpt.safetensors``...) are listed and skipped."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from nan_hunter.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """``nanhunter ...`` lines of the bash blocks (continuation lines joined, ``pip ... &&`` dropped)."""
    out, lang, buf = [], None, ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            lang = None if lang is not None else (line[3:].strip() or "text")
            continue
        if lang not in ("bash", "sh"):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        cmd, buf = buf.strip(), ""
        cmd = cmd.split("&&")[-1].strip()
        if cmd.startswith("nanhunter "):
            out.append(cmd)
    return out


COMMANDS = readme_commands()


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 8


def _runnable(cmd: str) -> bool:
    args = shlex.split(cmd, comments=True)[2:]
    return bool(args) and (ROOT / args[0]).exists()


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command(cmd, tmp_path, monkeypatch):
    if not _runnable(cmd):
        pytest.skip(f"placeholder paths: {cmd}")
    argv = shlex.split(cmd, comments=True)[1:]
    argv = [str(ROOT / a) if a.startswith("examples/") else a for a in argv]
    m = re.search(r"#\s*exit (\d)", cmd)
    monkeypatch.chdir(tmp_path)
    code = main([*argv, "--quiet"] if "--quiet" not in argv else argv)
    if m:
        assert code == int(m.group(1)), cmd
    else:
        assert code in (0, 1), cmd
