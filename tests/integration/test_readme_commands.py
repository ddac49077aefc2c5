"""Every ``nanhunter`` command in the shell blocks of README.md and of every page under docs/ is run
(in-process, ``cli.main.main``, from a scratch directory so outputs land there) and exits as its
``# exit N`` comment says. A command that appears on several pages runs once. Commands on placeholder
paths (``./model``, ``ckpt.safetensors``...) are listed and skipped."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from nan_hunter.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
#: the pages whose commands run: the README, then docs/ in path order (docs/pending/ included)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_commands(page: Path) -> list[str]:
    """``nanhunter ...`` lines of a page's bash blocks (continuation lines joined, ``pip ... &&`` dropped)."""
    out, lang, buf = [], None, ""
    for line in page.read_text(encoding="utf-8").splitlines():
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


def readme_commands() -> list[str]:
    return page_commands(ROOT / "README.md")


def docs_commands() -> dict[str, str]:
    """Each distinct command (comments and spacing aside) -> the first page that holds it."""
    first: dict[str, tuple[str, str]] = {}
    for page in PAGES:
        for cmd in page_commands(page):
            first.setdefault(
                " ".join(shlex.split(cmd, comments=True)), (cmd, page.relative_to(ROOT).as_posix())
            )
    return dict(first.values())


COMMANDS = docs_commands()


def test_the_readme_has_commands():
    """The README keeps its three examples and the quick start's scan."""
    assert len(readme_commands()) >= 3


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 15
    assert any(page.startswith("docs/") for page in COMMANDS.values())


def _runnable(cmd: str) -> bool:
    args = shlex.split(cmd, comments=True)[2:]
    return bool(args) and (ROOT / args[0]).exists()


@pytest.mark.parametrize("cmd", list(COMMANDS), ids=[f"{p}: {c}" for c, p in COMMANDS.items()])
def test_docs_command(cmd, tmp_path, monkeypatch):
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
