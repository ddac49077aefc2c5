"""The type check's configuration (pyproject.toml's ``[tool.mypy]``, CONTRIBUTING.md "Type checking")
stays what it claims: the strict folders carry every flag of ``--strict``, every module an override names
exists (a renamed or deleted module would leave a stale entry, and a new name outside every list), the
``dev`` extra installs mypy, and ``.ci/run`` runs it and fails on its errors. mypy itself runs in CI, not
here: a cold run is ~40 s of CPU."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
STRICT = {
    "nan_hunter.dtypes",
    "nan_hunter.explain.*",
    "nan_hunter.kernels.*",
    "nan_hunter.load.*",
    "nan_hunter.locate.*",
    "nan_hunter.report",
}
#: what ``--strict`` sets (mypy 2.4), the two global-only flags left out: they are in ``[tool.mypy]``
STRICT_FLAGS = {
    "disallow_any_generics": True,
    "disallow_subclassing_any": True,
    "disallow_untyped_calls": True,
    "disallow_untyped_defs": True,
    "disallow_incomplete_defs": True,
    "check_untyped_defs": True,
    "disallow_untyped_decorators": True,
    "warn_return_any": True,
    "implicit_reexport": False,
    "strict_equality": True,
    "extra_checks": True,
}
GLOBAL_FLAGS = {"warn_redundant_casts": True, "warn_unused_ignores": True}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _overrides() -> list[dict]:
    return _pyproject()["tool"]["mypy"]["overrides"]


def _modules(override: dict) -> list[str]:
    m = override["module"]
    return [m] if isinstance(m, str) else list(m)


def _exists(module: str) -> bool:
    path = ROOT / Path(*module.removesuffix(".*").split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_strict_folders_carry_every_strict_flag():
    (strict,) = [o for o in _overrides() if set(_modules(o)) == STRICT]
    assert {k: strict.get(k) for k in STRICT_FLAGS} == STRICT_FLAGS
    assert "strict" not in strict  # per module, mypy turns disallow_any_generics on for every module
    top = _pyproject()["tool"]["mypy"]
    assert {k: top.get(k) for k in GLOBAL_FLAGS} == GLOBAL_FLAGS
    assert top["files"] == ["nan_hunter"]


def test_strict_flags_are_mypys_own():
    """The list above against the installed mypy's ``--strict`` (skipped where mypy is not installed)."""
    mypy_main = pytest.importorskip("mypy.main")
    _, _, assignments = mypy_main.define_options()
    assert dict(assignments) == STRICT_FLAGS | GLOBAL_FLAGS


def test_every_module_an_override_names_exists():
    stale = [m for o in _overrides() for m in _modules(o) if m.startswith("nan_hunter") and not _exists(m)]
    assert stale == [], f"pyproject.toml's [tool.mypy] names modules that are gone: {stale}"


def test_no_module_is_excused_from_the_type_check():
    """Every module is clean (the list of modules "not yet clean" emptied on 2026-11-28): none is
    excused with ``ignore_errors``; a module that cannot be made clean at once is fixed, not listed."""
    excused = [_modules(o) for o in _overrides() if o.get("ignore_errors")]
    assert excused == [], f"modules excused from mypy: {excused}"


def test_untyped_libraries_are_ignored_by_name_only():
    assert "ignore_missing_imports" not in _pyproject()["tool"]["mypy"]
    for o in _overrides():
        if o.get("ignore_missing_imports"):
            assert not any(m.startswith("nan_hunter") for m in _modules(o))


def test_the_dev_extra_installs_mypy_within_one_minor_release():
    dev = {
        Requirement(r).name.lower(): Requirement(r)
        for r in _pyproject()["project"]["optional-dependencies"]["dev"]
    }
    ops = {s.operator for s in dev["mypy"].specifier}
    assert ops == {">=", "<"}, "mypy pinned to one minor release: a new one adds checks"
    assert "types-pyyaml" in dev


def test_ci_runs_mypy_and_fails_on_its_errors():
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "background mypy python -m mypy\n" in run
    assert "\nawait mypy\n" in run  # await returns the job's exit status: set -e ends the run
