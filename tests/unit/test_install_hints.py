"""Install hints that work (issue 32, item 5): nanhunter is not on PyPI, so every hint installs an
extra from the clone (``pip install -e '.[hf]'``), never ``pip install 'nan-hunter[hf]'``; and the
``hf`` extra gives transformers' Trainer what it needs (accelerate, at transformers' own floor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nan_hunter.errors import install_hint

ROOT = Path(__file__).resolve().parents[2]
#: a pip install of nanhunter by name from an index: `pip install "nanhunter[x]"`, 'nan-hunter[plot]', nan_hunter
FROM_INDEX = re.compile(r"pip install (?:-U |--upgrade )?['\"]?nan[-_]?hunter\b")


def _texts():
    for p in [
        *ROOT.joinpath("nan_hunter").rglob("*.py"),
        ROOT / "README.md",
        *ROOT.joinpath("docs").rglob("*.md"),
        *ROOT.joinpath("examples").rglob("*.yml"),
        *ROOT.joinpath("examples").rglob("*.md"),
    ]:
        yield p, p.read_text(encoding="utf-8")


def test_no_hint_installs_nanhunter_from_an_index():
    bad = [
        f"{p.relative_to(ROOT)}:{t[: m.start()].count(chr(10)) + 1}"
        for p, t in _texts()
        for m in FROM_INDEX.finditer(t)
    ]
    assert not bad, bad


def test_the_hint_installs_the_extra_from_the_clone():
    assert install_hint("lightning") == "pip install -e '.[lightning]' in the nanhunter clone"


def test_hf_extra_holds_what_the_trainer_needs():
    transformers = pytest.importorskip("transformers")
    from transformers.utils import import_utils

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    accelerate = [r for r in extras["hf"] if re.match(r"accelerate\b", r)]
    assert accelerate, extras["hf"]
    floor = re.search(r">=\s*([\d.]+)", accelerate[0]).group(1)
    need = getattr(import_utils, "ACCELERATE_MIN_VERSION", None)
    assert need is not None, transformers.__version__
    key = [int(x) for x in floor.split(".")]
    assert key >= [int(x) for x in need.split(".")], (floor, need)
