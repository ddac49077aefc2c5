"""The shape of ``nan_hunter/render``: no import cycle, rich only in the terminal view, no torch,
no file written except through ``outputs``."""

from __future__ import annotations

import ast
from pathlib import Path

RENDER = Path(__file__).resolve().parents[3] / "nan_hunter" / "render"
TERMINAL_ONLY = {
    "terminal",
    "progress",
    "help",
}  # the modules that may use rich (help: the examples under --help)


def _module(path: Path) -> str:
    rel = path.relative_to(RENDER.parent.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function, resolved to absolute names."""
    pkg = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            out.add(prefix)
            out |= {f"{prefix}.{a.name}" for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in RENDER.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}


def test_render_has_no_import_cycle():
    graph = _graph()
    assert "nan_hunter.render.rows" in graph and "nan_hunter.render.terminal.layout" in graph
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, f"import cycle: {' -> '.join(path + [m, n])}"
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_rich_only_in_the_terminal_view_and_no_torch():
    for p in RENDER.rglob("*.py"):
        mods = {i.split(".")[0] for i in _imports(p)}
        rel = p.relative_to(RENDER).parts[0].removesuffix(".py")
        assert "torch" not in mods, f"{p.name} imports torch: render formats, it does not compute"
        if rel not in TERMINAL_ONLY:
            assert "rich" not in mods, (
                f"{p} imports rich: only render/terminal, render/progress and render/help may"
            )


def test_files_are_written_only_through_outputs():
    """Renderers return text or bytes; the few ``write_*`` helpers hand them to ``outputs``."""
    for p in RENDER.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                direct = isinstance(f, ast.Attribute) and name in ("write_text", "write_bytes", "open")
                assert name != "open" and not direct, f"{p.name}:{node.lineno} writes a file itself"
