"""The test tree's layout (issue 33, item 7): unit tests mirror the package, and a test starts a
process only where the process boundary is the point.

**A module with logic** is a ``nan_hunter/`` module that defines a function or a method (``def``
anywhere in it). Left out, because there is nothing in them to run: re-export ``__init__.py``
files (imports, ``__all__``, a docstring), ``__main__.py`` (one call to the CLI's entry point) and
pure-data modules (constants, dataclasses with fields only: ``version.py``, ``capture/records.py``).
An ``__init__.py`` that does define functions counts like any module.

**Its mirrored test** is ``tests/unit/<package path>/test_<module>.py`` (an ``__init__.py`` with
logic: ``test_init.py`` in its folder); it must import the module it mirrors, so a file at the
right path that tests something else does not count. More test files per module are fine.

**A test that starts a process** is a test function (``test_*``, methods of ``Test*`` classes
included; a parametrized test counts once) whose code reaches a process start: a call into
``subprocess``, ``os.system``/``fork``/``exec*``/``spawn*``, ``multiprocessing`` or
``torch.multiprocessing``, through the test's body, the helpers it calls or refers to (followed
across the test tree's own modules, e.g. ``clirun.run_cli`` and the ``torchrun`` helper of
``test_torchrun_split``), and the fixtures it requests (conftest chain, autouse and
``usefixtures`` included, fixtures requesting fixtures followed). Found by ``ast``, so a script in
a string that the test hands to a process does not count twice.

Run ``python tests/unit/test_test_layout.py`` for the counts and the list of such tests by file.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "nan_hunter"
TESTS = ROOT / "tests"
UNIT = TESTS / "unit"

#: the most test functions that may start a process (issue 33, item 7: "fewer than 60")
MAX_PROCESS_TESTS = 59

#: modules with logic and no mirrored unit test, each with why: the only honest test runs the
#: real thing (named here).
NO_MIRROR: dict[str, str] = {
    # the Triton kernel is tested as Liger tests its kernels: against the torch reference, on odd
    # shapes and every dtype, interpreted on the CPU (tests/kernels/test_triton_interpret.py) and
    # compiled on a GPU (tests/kernels/test_triton_gpu.py); a unit test here would repeat them
    "nan_hunter/kernels/triton.py": "tests/kernels/test_triton_interpret.py, tests/kernels/test_triton_gpu.py",
}

#: top-level files of ``tests/unit/`` that test no one module: the layout of the package and of
#: the tests, the oracle beside the tool, the pins CI installs, hints across the code and docs
CROSS_CUTTING = {
    "test_import_graph.py",
    "test_test_layout.py",
    "test_oracle_independent.py",
    "test_oracle_truth.py",
    "test_floors.py",
    "test_install_hints.py",
    "test_type_check.py",
}


# --- modules with logic and their mirrored tests ------------------------------------------------------
def has_logic(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))


def modules_with_logic() -> list[str]:
    """``nan_hunter/...py`` paths (relative to the repository) of every module with logic."""
    return [p.relative_to(ROOT).as_posix() for p in sorted(PKG.rglob("*.py")) if has_logic(p)]


def mirrored_test(module: str) -> Path:
    """``nan_hunter/a/b.py`` → ``tests/unit/a/test_b.py``; ``nan_hunter/a/__init__.py`` → ``tests/unit/a/test_init.py``."""
    rel = Path(module).relative_to("nan_hunter")
    stem = "init" if rel.name == "__init__.py" else rel.stem
    return UNIT / rel.parent / f"test_{stem}.py"


def dotted(module: str) -> str:
    parts = list(Path(module).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_module(test: Path, module: str) -> bool:
    """Whether ``test`` imports ``module`` (``import a.b``, ``from a.b import x``, ``from a import b``)."""
    want = dotted(module)
    tree = ast.parse(test.read_text(encoding="utf-8"), filename=str(test))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name == want or a.name.startswith(want + ".") for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == want or node.module.startswith(want + "."):
                return True
            if any(f"{node.module}.{a.name}" == want for a in node.names):
                return True
    return False


def missing_mirrors() -> list[str]:
    return [
        m
        for m in modules_with_logic()
        if m not in NO_MIRROR and not (mirrored_test(m).exists() and imports_module(mirrored_test(m), m))
    ]


# --- tests that start a process -----------------------------------------------------------------------
_PROCESS_MODULES = {"subprocess", "multiprocessing", "torch.multiprocessing"}
_OS_STARTS = ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "exec", "spawn")


@dataclass
class _Module:
    path: Path
    tree: ast.Module
    funcs: dict[str, ast.AST] = field(default_factory=dict)  # module-level functions and classes
    aliases: dict[str, str] = field(
        default_factory=dict
    )  # local name -> imported module ("sp" -> "subprocess")
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    fixtures: dict[str, ast.AST] = field(default_factory=dict)


def _fixture_name(fn: ast.AST) -> str | None:
    for d in getattr(fn, "decorator_list", []):
        call = d if isinstance(d, ast.Call) else None
        target = call.func if call else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "fixture":
            for kw in call.keywords if call else []:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    return kw.value.value
            return fn.name
    return None


def _is_autouse(fn: ast.AST) -> bool:
    return any(
        isinstance(d, ast.Call)
        and any(k.arg == "autouse" and getattr(k.value, "value", False) for k in d.keywords)
        for d in fn.decorator_list
    )


def _module_name(path: Path, root: Path) -> list[str]:
    """The names a test module is imported by: its stem (rootdir-relative ``prepend`` imports of
    folders without ``__init__.py``) and its dotted path from ``tests/``."""
    rel = path.relative_to(root).with_suffix("")
    return [path.stem, ".".join(rel.parts), "tests." + ".".join(rel.parts)]


class ProcessCensus:
    """Which test functions of ``tests/`` reach a process start."""

    def __init__(self, root: Path = TESTS) -> None:
        self.root = root
        self.modules: dict[Path, _Module] = {}
        by_name: dict[str, Path] = {}
        for p in sorted(root.rglob("*.py")):
            m = _Module(p, ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
            for node in m.tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    m.funcs[node.name] = node
                    fx = _fixture_name(node)
                    if fx:
                        m.fixtures[fx] = node
            for node in ast.walk(m.tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        m.aliases[a.asname or a.name.split(".")[0]] = (
                            a.name if a.asname else a.name.split(".")[0]
                        )
                elif isinstance(node, ast.ImportFrom) and node.module:
                    base = node.module
                    if node.level:  # relative: resolved against the file's folder
                        base = ".".join([*p.relative_to(root).parent.parts, node.module])
                    for a in node.names:
                        full = f"{base}.{a.name}"
                        if full in _PROCESS_MODULES:  # from torch import multiprocessing as mp
                            m.aliases[a.asname or a.name] = full
                        m.imported[a.asname or a.name] = (base, a.name)
            self.modules[p] = m
            for n in _module_name(p, root):
                by_name.setdefault(n, p)
        self._by_name = by_name
        self._memo: dict[int, bool] = {}

    # a node "starts" when it calls a process primitive, or refers to a function that starts
    def _primitive(self, m: _Module, node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            chain = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                base = m.aliases.get(cur.id, cur.id if cur.id in ("os",) else None)
                dotted_ = ".".join([base or "", *reversed(chain)])
                if base and any(dotted_.startswith(pm + ".") for pm in _PROCESS_MODULES):
                    return True
                if base == "os" and chain and chain[-1].startswith(_OS_STARTS):
                    return True
        if isinstance(node, ast.Name) and node.id in m.imported:
            mod, name = m.imported[node.id]
            if mod in _PROCESS_MODULES or (mod == "os" and name.startswith(_OS_STARTS)):
                return True
        return False

    def _resolve(self, m: _Module, name: str) -> tuple[_Module, ast.AST] | None:
        if name in m.funcs:
            return m, m.funcs[name]
        if name in m.imported:
            mod, obj = m.imported[name]
            p = self._by_name.get(mod)
            if p is not None and obj in self.modules[p].funcs:
                return self.modules[p], self.modules[p].funcs[obj]
        return None

    def starts(self, m: _Module, fn: ast.AST, seen: frozenset = frozenset()) -> bool:
        """Whether ``fn``'s code (nested functions included) reaches a process start."""
        key = id(fn)
        if key in self._memo:
            return self._memo[key]
        if key in seen:
            return False
        seen = seen | {key}
        found = False
        for node in ast.walk(fn):
            if self._primitive(m, node):
                found = True
                break
            if isinstance(node, ast.Name) and node is not fn:
                hit = self._resolve(m, node.id)
                if hit is not None and hit[1] is not fn and self.starts(hit[0], hit[1], seen):
                    found = True
                    break
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                p = self._by_name.get(m.aliases.get(node.value.id, ""))
                if (
                    p is not None
                    and node.attr in self.modules[p].funcs
                    and self.starts(self.modules[p], self.modules[p].funcs[node.attr], seen)
                ):
                    found = True
                    break
        self._memo[key] = found
        return found

    # fixtures: the test module's own, then conftest.py files from its folder up to tests/
    def _fixture(self, path: Path, name: str) -> tuple[_Module, ast.AST] | None:
        m = self.modules[path]
        if name in m.fixtures:
            return m, m.fixtures[name]
        for folder in [path.parent, *path.parent.parents]:
            conf = self.modules.get(folder / "conftest.py")
            if conf is not None and name in conf.fixtures:
                return conf, conf.fixtures[name]
            if folder == self.root:
                break
        return None

    def _autouse(self, path: Path) -> list[str]:
        names = [n for n, f in self.modules[path].fixtures.items() if _is_autouse(f)]
        for folder in [path.parent, *path.parent.parents]:
            conf = self.modules.get(folder / "conftest.py")
            if conf is not None:
                names += [n for n, f in conf.fixtures.items() if _is_autouse(f)]
            if folder == self.root:
                break
        return names

    def _requested(self, fn: ast.AST, cls: ast.ClassDef | None) -> list[str]:
        names = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "request")]
        for d in [*fn.decorator_list, *(cls.decorator_list if cls else [])]:
            if isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "usefixtures":
                names += [a.value for a in d.args if isinstance(a, ast.Constant)]
        return names

    def test_starts(self, path: Path, fn: ast.AST, cls: ast.ClassDef | None = None) -> bool:
        m = self.modules[path]
        if self.starts(m, fn):
            return True
        todo, done = [*self._requested(fn, cls), *self._autouse(path)], set()
        while todo:
            name = todo.pop()
            if name in done:
                continue
            done.add(name)
            hit = self._fixture(path, name)
            if hit is None:
                continue
            fm, fx = hit
            if self.starts(fm, fx):
                return True
            todo += [a.arg for a in fx.args.args if a.arg not in ("self", "request")]
        return False

    def tests(self):
        """``(path, name, node, class)`` for every test function in a ``test_*.py`` file."""
        for path, m in self.modules.items():
            if not path.name.startswith("test_"):
                continue
            for node in m.tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                    yield path, node.name, node, None
                elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                    for sub in node.body:
                        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith(
                            "test"
                        ):
                            yield path, f"{node.name}.{sub.name}", sub, node

    def process_tests(self) -> dict[str, list[str]]:
        """``{test file (relative to the repository): [test functions that start a process]}``."""
        out: dict[str, list[str]] = defaultdict(list)
        for path, name, node, cls in self.tests():
            if self.test_starts(path, node, cls):
                out[path.relative_to(self.root.parent).as_posix()].append(name)
        return dict(out)


# --- the tests ------------------------------------------------------------------------------------------
@functools.cache
def process_tests() -> dict[str, list[str]]:
    return ProcessCensus().process_tests()


def test_every_module_with_logic_has_a_mirrored_unit_test():
    missing = missing_mirrors()
    assert not missing, "no unit test at the mirrored path (or it does not import its module):\n" + "\n".join(
        f"  {m} -> {mirrored_test(m).relative_to(ROOT)}" for m in missing
    )


def test_the_allowlist_names_only_modules_that_still_lack_a_mirror():
    """An entry goes once the module is gone or its mirrored test exists."""
    logic = set(modules_with_logic())
    stale = [
        m
        for m in NO_MIRROR
        if m not in logic or (mirrored_test(m).exists() and imports_module(mirrored_test(m), m))
    ]
    assert not stale, stale


def test_top_level_unit_files_mirror_top_level_modules():
    """A file at the top of ``tests/unit/`` tests a top-level module (``test_dtypes.py`` →
    ``nan_hunter/dtypes.py``; ``test_init.py`` → the public API) or is one of the few that test no
    one module (``CROSS_CUTTING``)."""
    stray = [
        p.name
        for p in sorted(UNIT.glob("test_*.py"))
        if p.name not in CROSS_CUTTING
        and not (PKG / f"{p.stem[len('test_') :]}.py").exists()
        and p.name != "test_init.py"
    ]  # nan_hunter/__init__.py
    assert not stray, stray


def test_unit_folders_mirror_packages():
    stray = [
        p.relative_to(UNIT).as_posix()
        for p in sorted(UNIT.rglob("*"))
        if p.is_dir() and p.name != "__pycache__" and not (PKG / p.relative_to(UNIT)).is_dir()
    ]
    assert not stray, stray


def test_few_tests_start_a_process():
    found = process_tests()
    count = sum(map(len, found.values()))
    assert count <= MAX_PROCESS_TESTS, f"{count} test functions start a process:\n" + "\n".join(
        f"  {f}: {', '.join(names)}" for f, names in sorted(found.items())
    )


def test_the_census_sees_each_way_of_starting_a_process(tmp_path):
    """The counter itself: a direct ``subprocess`` call, an aliased import, a helper in another
    test module, a fixture (through a fixture), ``os.fork``, ``run_cli`` through ``clirun`` — and
    not a script in a string, nor an in-process call."""
    (tmp_path / "helpers.py").write_text(
        "import subprocess as sp\ndef launch(*a):\n    return sp.Popen(a)\ndef pure(*a):\n    return a\n"
    )
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom helpers import launch\n"
        "@pytest.fixture\ndef runner():\n    return launch\n"
        "@pytest.fixture(name='outer')\ndef outer_fixture(runner):\n    return runner\n"
        "@pytest.fixture\ndef quiet():\n    return 1\n"
    )
    (tmp_path / "test_x.py").write_text(
        "import os, subprocess\nfrom subprocess import run\nfrom helpers import launch, pure\n"
        "def test_direct():\n    subprocess.run(['true'])\n"
        "def test_from_import():\n    run(['true'])\n"
        "def test_helper():\n    launch('true')\n"
        "def test_fixture(outer):\n    outer('true')\n"
        "def test_fork():\n    os.fork()\n"
        "class TestC:\n    def test_method(self):\n        launch()\n"
        "def test_string():\n    code = 'import subprocess; subprocess.run([])'\n    assert code\n"
        "def test_pure(quiet):\n    assert pure(quiet)\n"
        "def test_getcwd():\n    assert os.getcwd()\n"
    )
    census = ProcessCensus(tmp_path)
    found = {name for path, name, node, cls in census.tests() if census.test_starts(path, node, cls)}
    assert found == {
        "test_direct",
        "test_from_import",
        "test_helper",
        "test_fixture",
        "test_fork",
        "TestC.test_method",
    }


def test_the_real_tree_is_counted():
    """``run_cli`` through the ``cli`` fixture and ``clirun``, and the torchrun helper imported from
    another test module, are seen in the real tree."""
    found = process_tests()
    assert "tests/integration/test_torchrun_split.py" in found
    assert "tests/integration/test_modes_compose.py" in found
    assert any(f.startswith("tests/unit/cli/") for f in found)


if __name__ == "__main__":
    logic = modules_with_logic()
    mirrored = [m for m in logic if mirrored_test(m).exists() and imports_module(mirrored_test(m), m)]
    print(
        f"modules with logic: {len(logic)}; with a mirrored unit test that imports them: {len(mirrored)}; "
        f"allowlisted: {len([m for m in logic if m in NO_MIRROR and m not in mirrored])}; "
        f"missing: {len(missing_mirrors())}"
    )
    for m in missing_mirrors():
        print(f"  missing: {m} -> {mirrored_test(m).relative_to(ROOT)}")
    found = process_tests()
    print(f"test functions that start a process: {sum(map(len, found.values()))} in {len(found)} files")
    for f, names in sorted(found.items()):
        print(f"  {len(names):3d} {f}: {', '.join(names)}")
