"""The oracle (``tests/oracle``) shares no code with nanhunter: no module in it imports
``nan_hunter`` in any form (``import nan_hunter``, ``from nan_hunter.x import y``, a function-level
import, ``importlib.import_module("nan_hunter...")`` or ``__import__``), read from the source with
``ast``. Only then is a disagreement between them worth reading."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ORACLE = Path(__file__).resolve().parents[1] / "oracle"
PKG = "nan_hunter"


def _names_package(name: str | None) -> bool:
    return bool(name) and (name == PKG or name.startswith(PKG + "."))


def package_imports(source: str, filename: str = "<src>") -> list[str]:
    """Every way ``source`` reaches the package: import statements anywhere, dynamic imports by a
    literal name, and relative imports that climb out of ``tests/oracle`` (always refused)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if _names_package(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                found.append(
                    f"from {'.' * node.level}{node.module or ''} import ... (climbs out of the oracle)"
                )
            elif node.level == 0 and _names_package(node.module):
                found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _names_package(arg.value):
                    found.append(f"{name}({arg.value!r})")
    return found


def test_oracle_imports_nothing_from_nan_hunter():
    files = sorted(ORACLE.rglob("*.py"))
    assert {p.name for p in files} >= {"truth.py", "planted.py"}
    bad = {
        str(p.relative_to(ORACLE)): found
        for p in files
        if (found := package_imports(p.read_text(encoding="utf-8"), str(p)))
    }
    assert not bad, f"the oracle must not use nanhunter's code: {bad}"


@pytest.mark.parametrize(
    "src",
    [
        "import nan_hunter",
        "import nan_hunter.capture.ops as ops",
        "from nan_hunter import watch",
        "from nan_hunter.kernels.reference import plain",
        "def f():\n    from nan_hunter.dtypes import RunDtype",
        "import importlib\nimportlib.import_module('nan_hunter.locate')",
        "__import__('nan_hunter')",
        "from ..integration import test_oracle_matrix",
    ],
)
def test_the_check_sees_every_form(src):
    assert package_imports(src)


@pytest.mark.parametrize(
    "src",
    [
        "import torch",
        "from .truth import Tracer",
        "import nan_hunter_tests",
        "from transformers import LlamaConfig",
    ],
)
def test_the_check_lets_others_be(src):
    assert not package_imports(src)
