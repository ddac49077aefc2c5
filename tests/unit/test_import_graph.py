"""The package's layout: no import cycle in ``nan_hunter/``, every import going down the layers
(``LAYERS``), and no submodule that shadows the public ``nan_hunter.scan``, ``watch`` or ``bisect``.

The graph is built from the source with ``ast``: every ``import``/``from ... import`` anywhere
in a module (inside functions too: a lazy import is still a dependency), relative imports
resolved against the module's package. ``from pkg import name`` depends on ``pkg.name`` when
that is a module, else on ``pkg`` itself. Imports under ``if TYPE_CHECKING:`` never run and are
left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = "nan_hunter"
ROOT = Path(__file__).resolve().parents[2] / PKG


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of import nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    skip |= {id(n) for n in ast.walk(stmt)}
    return skip


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    skip = _type_checking_nodes(tree)
    deps: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts)
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                deps.add(sub if sub in known else target)
    return {d for d in deps if d in known and d != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per component, as a path that ends where it starts."""
    return [cycle_path(graph, set(c)) for c in components(graph)]


def cycle_path(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One concrete cycle through a component: a shortest path back to its first module."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)  # pragma: no cover - a component always has a cycle


# --- layers ------------------------------------------------------------------------------------------
#: The package's units (a folder, or a module at the top of ``nan_hunter/``) from the bottom up: the
#: pipeline (load → model → capture → locate → explain → render) with the ways it is driven above
#: it (a watch, the modes behind the harness, bisect, the commands, the CLI and the public API). A
#: unit imports only units of a lower layer (its own modules aside), inside functions too: a lazy
#: import is still a dependency. A new folder or top-level module gets a layer here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("version", "errors", "progress", "tree"),  # leaves: nothing of the package below them
    ("dtypes", "outputs", "options"),  # the one dtype rule, the one writer, options defined once
    ("config", "report"),
    ("kernels",),  # statistics (the row layout, the Triton kernel, the torch reference), the one comparison
    ("load",),  # checkpoints, headers, weights scans, quantized formats, capsules
    ("model",),  # building, inputs, placement, casting, fp8 emulation
    ("capture",),  # hooks → records
    ("trace",),  # records → a numerics trace
    ("divergence", "forecast"),  # two recordings → where they part; sampled statistics → forecast, precursors
    ("locate",),  # a recording and its re-runs → where (a re-run judged against its recording by divergence)
    ("distributed", "explain"),  # ranks; replay, diagnosis, fix check, the one assembler
    ("serving",),  # packed batches: requests, their replays alone, abort
    ("render",),  # every view of a report
    ("session",),  # nan_hunter.watch and what training adds
    ("modes",),  # the harness and the modes behind it, its torchrun split
    ("bisection",),
    ("pipeline",),  # the commands as functions
    ("cli", "__init__"),  # the command line; the public API
    ("__main__", "integrations"),  # python -m nan_hunter; the Trainer and Lightning callbacks
)


def unit_of(module: str) -> str:
    """``nan_hunter.capture.ops`` → ``capture``; ``nan_hunter.errors`` → ``errors``; the package → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import of a unit from its own layer or above, as 'module -> module (unit L -> unit L)'."""
    rank = {u: i for i, layer in enumerate(layers) for u in layer}
    bad = []
    for mod, deps in sorted(graph.items()):
        a = unit_of(mod)
        for dep in sorted(deps):
            b = unit_of(dep)
            if a != b and rank[b] >= rank[a]:
                bad.append(f"{mod} -> {dep}  ({a}, layer {rank[a]} -> {b}, layer {rank[b]})")
    return bad


# --- the checker itself, on small graphs -----------------------------------------------------------
def test_checker_finds_cycles_and_accepts_a_dag():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    found = cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert found == [["a", "b", "c", "a"]]


def test_checker_resolves_relative_and_lazy_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from . import report\n"
        "from .render import html, helper_fn\n"
        "from ..errors import BadInput\n"
        "import nan_hunter.load.checkpoint\n"
        "if TYPE_CHECKING:\n"
        "    from .typing_only import T\n"
        "def f():\n"
        "    from .lazy import g\n"
    )
    known = {
        "nan_hunter.cli.report",
        "nan_hunter.cli.render",
        "nan_hunter.cli.render.html",
        "nan_hunter.errors",
        "nan_hunter.load.checkpoint",
        "nan_hunter.cli.lazy",
        "nan_hunter.cli.typing_only",
        "nan_hunter.cli.m",
    }
    assert imports_of("nan_hunter.cli.m", src, known) == {
        "nan_hunter.cli.report",
        "nan_hunter.cli.render.html",
        "nan_hunter.cli.render",
        "nan_hunter.errors",
        "nan_hunter.load.checkpoint",
        "nan_hunter.cli.lazy",
    }


# --- the package ---------------------------------------------------------------------------------
def test_no_import_cycle():
    graph = import_graph()
    found = components(graph)
    assert not found, "import cycles in nan_hunter/:\n" + "\n".join(
        f"{' -> '.join(cycle_path(graph, set(c)))}  (all {len(c)} modules of this cycle: {', '.join(c)})"
        for c in found
    )


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m in modules()}
    ranked = [u for layer in LAYERS for u in layer]
    assert len(ranked) == len(set(ranked)), "a unit is in two layers"
    assert units == set(ranked), (
        f"not in LAYERS: {sorted(units - set(ranked))}; in LAYERS but gone: {sorted(set(ranked) - units)}"
    )


def test_imports_go_down_the_layers():
    found = upward_imports(import_graph(), LAYERS)
    order = "\n".join(f"  {i}: {', '.join(layer)}" for i, layer in enumerate(LAYERS))
    assert not found, "imports up (or across) the layers:\n" + "\n".join(found) + f"\nthe layers:\n{order}"


def test_the_layer_checker_flags_upward_and_sideways_imports():
    graph = {
        "nan_hunter.load.a": {"nan_hunter.errors"},
        "nan_hunter.errors": set(),
        "nan_hunter.capture.b": {"nan_hunter.load.a", "nan_hunter.explain.c"},
        "nan_hunter.explain.c": {"nan_hunter.locate.d"},
        "nan_hunter.locate.d": set(),
    }
    layers = (("errors",), ("load",), ("capture",), ("locate", "explain"))
    assert upward_imports(graph, layers) == [
        "nan_hunter.capture.b -> nan_hunter.explain.c  (capture, layer 2 -> explain, layer 3)",
        "nan_hunter.explain.c -> nan_hunter.locate.d  (explain, layer 3 -> locate, layer 3)",
    ]


def lazy_imports_without_a_reason(root: Path = ROOT) -> list[str]:
    """``path:line`` of every import of the package inside a function whose statement carries no
    ``# lazy: why`` comment (a function-level import is kept only where laziness is the point)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        for fn in ast.walk(ast.parse(src)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PKG)):
                    text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                    if "# lazy: " not in text:
                        out.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}")
    return sorted(set(out))


def test_every_function_level_import_says_why_it_is_lazy():
    """Issue 33: the package's own modules are imported at the top, except where a lazy import is the
    point (``--help`` and weights-only runs without torch, rich or typer; ``import nan_hunter`` light;
    optional libraries), and then the import says so."""
    assert lazy_imports_without_a_reason() == []


def test_the_lazy_checker_finds_an_unexplained_import(tmp_path):
    pkg = tmp_path / PKG
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "def f():\n    from .b import x  # lazy: torch\n    from .c import y\n"
        "    from .d import (  # lazy: rich\n        z,\n    )\n    import json\n"
    )
    assert lazy_imports_without_a_reason(pkg) == [f"{PKG}/a.py:3"]


def test_no_submodule_shadows_the_public_api():
    """``nan_hunter.scan`` etc. are functions; a submodule of that name would replace them as soon
    as anything imported it."""
    for name in ("scan", "watch", "bisect"):
        assert not (ROOT / f"{name}.py").exists(), f"nan_hunter/{name}.py shadows nan_hunter.{name}()"
        assert not (ROOT / name).is_dir(), f"nan_hunter/{name}/ shadows nan_hunter.{name}()"


# --- what the torch-free parts import, in one fresh interpreter ------------------------------------
#: Steps run in order in one new process (sys.modules is the point, so a process; one, not one per
#: claim): each imports or calls a part that must not load the modules named beside it. Modules only
#: accumulate, so the first step that loads a forbidden module is the one blamed.
_STEPS = r"""
import json, sys
steps = []
def step(name, forbidden, fn=None):
    got = fn() if fn else None
    steps.append({"step": name, "loaded": sorted(m for m in forbidden if m in sys.modules), "got": got})

NO_TORCH = ("torch", "transformers", "lightning", "pytorch_lightning")
import nan_hunter.render.html, nan_hunter.render.markdown, nan_hunter.render.ci, nan_hunter.render.report_file
step("render's file views", NO_TORCH + ("rich",))
import nan_hunter.bisection.search
step("bisection.search", NO_TORCH)
import nan_hunter.explain.weights_verdict
step("explain.weights_verdict", NO_TORCH)
from nan_hunter.distributed import collectives as co, ranks
step("collectives and ranks without a group", NO_TORCH,
     lambda: [co.active(), co.rank(), co.world(), ranks.launched(), ranks.writes()])
from nan_hunter.report import torch_version
step("report.torch_version", NO_TORCH, torch_version)
import nan_hunter
from nan_hunter.config import default_config
from nan_hunter.errors import BadInput
from nan_hunter.load.checkpoint import open_checkpoint
from nan_hunter.model.prepare import prepare
def weights_only_prepare():
    ck = open_checkpoint(sys.argv[1])
    none = prepare(ck, None, None, None, None, None, "auto", default_config()) is None
    try:
        prepare(ck, None, [sys.argv[2]], None, None, None, "auto", default_config())
        refused = False
    except BadInput as e:
        refused = "no model can be built" in str(e)
    return [none, refused]
step("a weights-only prepare", NO_TORCH, weights_only_prepare)
from nan_hunter.pipeline.ci_check import check
def api():
    r = nan_hunter.scan(sys.argv[3], stats="full")
    c = check(sys.argv[4])
    return [r.exit_code(), c[0].check["passed"]]
step("nan_hunter.scan and check on weights only", NO_TORCH, api)
import nan_hunter.integrations, nan_hunter.integrations.callback_core  # torch, but no framework
from nan_hunter import NonFiniteError
step("the integrations core", NO_TORCH[1:], lambda: issubclass(NonFiniteError, RuntimeError))
print(json.dumps(steps))
"""


def test_torch_free_parts_load_no_torch(tmp_path):
    """The parts a weights-only run, a file view or a ``--help`` reaches load neither torch nor the
    frameworks (and the file views no rich): what they answer without it is right too."""
    import json
    import subprocess
    import sys

    import torch
    from clirun import cli_env
    from safetensors.torch import save_file

    save_file({"0.weight": torch.randn(4, 4, dtype=torch.float16)}, str(tmp_path / "m.safetensors"))
    save_file({"input": torch.ones(3, 4)}, str(tmp_path / "in.safetensors"))
    data = Path(__file__).resolve().parents[1] / "data"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _STEPS,
            str(tmp_path / "m.safetensors"),
            str(tmp_path / "in.safetensors"),
            str(data / "dtypes" / "edge_cases.safetensors"),
            str(data / "quant" / "gptq_4bit_sym_v1" / "model.safetensors"),
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads(out.stdout.strip().splitlines()[-1])}
    assert {k: s["loaded"] for k, s in steps.items() if s["loaded"]} == {}
    assert steps["collectives and ranks without a group"]["got"] == [False, 0, 1, False, True]
    assert steps["report.torch_version"]["got"] == torch.__version__  # read from the installed package
    assert steps["the integrations core"]["got"] is True
    assert steps["a weights-only prepare"]["got"] == [True, True]
    assert steps["nan_hunter.scan and check on weights only"]["got"] == [1, True]


# --- no private name across folders (issue 44) ------------------------------------------------------
def private_imports_across_units(root: Path = ROOT) -> list[str]:
    """``path:line: name`` of every ``from ... import _name`` (one leading underscore: private to its
    module) whose module is in another unit (``unit_of``: a folder, or a top-level module) than the
    importing one. A name another folder needs is public in its module."""
    mods = {
        ".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(root.rglob("*.py"))
    }
    out = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base) + (f".{node.module}" if node.module else "")
            else:
                target = node.module or ""
            if not target.startswith(PKG):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    source = f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target
                    if unit_of(source) != unit_of(name):
                        out.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}: {a.name}")
    return sorted(out)


def test_no_private_name_is_imported_from_another_folder():
    found = private_imports_across_units()
    assert not found, (
        "private names imported from another folder (make them public where they live, or move "
        "them to where they belong):\n" + "\n".join(found)
    )


def test_the_private_import_checker_flags_only_other_folders(tmp_path):
    pkg = tmp_path / PKG
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for d in (pkg, pkg / "a", pkg / "b"):
        (d / "__init__.py").write_text("")
    (pkg / "tree.py").write_text("_LEAVES = ()\n")
    (pkg / "a" / "x.py").write_text("_y = 1\ndef _f(): pass\n")
    (pkg / "a" / "z.py").write_text(
        "from .x import _y, _f\nfrom ..tree import _LEAVES\n"
    )  # same folder: fine
    (pkg / "b" / "w.py").write_text(
        "from ..a.x import _f, __doc__\ndef g():\n    from nan_hunter.a.x import _y\n"
    )
    assert private_imports_across_units(pkg) == [
        f"{PKG}/a/z.py:2: _LEAVES",
        f"{PKG}/b/w.py:1: _f",
        f"{PKG}/b/w.py:3: _y",
    ]
