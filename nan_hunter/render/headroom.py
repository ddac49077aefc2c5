"""The headroom strip: one terminal line per module call, a bar of log10(absmax) climbing towards
the run dtype's largest finite value, coloured by how much headroom is left."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..report import Report

WIDTH = 28
FLOOR = 1e-4  # the bar starts here: smaller outputs have more headroom than anything can use
CONTEXT = 4  # calls shown before the producer however small they are
NAME_WIDTH = 44


def reference_dtype(run_dtype: str | None) -> str:
    """Dtype whose max bounds the module outputs. fp8 runs compute in bf16 around emulated fp8
    operands, so their module outputs live in bf16's range, not e4m3's 448."""
    d = run_dtype or "fp32"
    return "bf16" if d.startswith("fp8") else d


def is_bad(row: dict[str, Any]) -> bool:
    return bool(row["nan"] or row["posinf"] or row["neginf"])


def producer_index(rep: Report) -> int | None:
    """Row of ``rep.modules`` holding the first producer (module + input + call)."""
    f = rep.first_nonfinite
    if f is None:
        return None
    return next((i for i, m in enumerate(rep.modules or []) if m["module"] == f.module
                 and m["input_index"] == f.input_index and m["call_index"] == f.call_index), None)


def fraction(row: dict[str, Any], mx: float) -> float:
    """absmax / dtype max; inf for a non-finite output (it has no headroom at all)."""
    if is_bad(row):
        return math.inf
    return (row["absmax"] or 0.0) / mx


def pick_rows(rows: list[dict[str, Any]], mx: float, producer: int | None, max_rows: int) -> list[int]:
    """Indices to show, in execution order: the tightest calls, and the producer with the few
    calls that led to it."""
    if len(rows) <= max_rows:
        return list(range(len(rows)))
    keep: set[int] = set()
    if producer is not None:
        keep.update(range(max(0, producer - CONTEXT), producer + 1))
    by_need = sorted(range(len(rows)), key=lambda i: fraction(rows[i], mx), reverse=True)
    for i in by_need:
        if len(keep) >= max_rows:
            break
        keep.add(i)
    return sorted(keep)


def _bar(row: dict[str, Any], mx: float) -> Text:
    if is_bad(row):
        kind = "NaN" if row["nan"] else "+inf" if row["posinf"] else "−inf"
        return Text("█" * WIDTH, style="bold red") + Text(f" {kind}", style="bold red")
    a = row["absmax"]
    if not a:
        return Text("·" * WIDTH, style="dim")
    lo, hi = math.log10(FLOOR), math.log10(mx)
    pos = min(1.0, max(0.0, (math.log10(a) - lo) / (hi - lo)))
    n = max(1, round(pos * WIDTH))
    frac = a / mx
    style = "red" if frac >= 0.5 else "yellow" if frac >= 0.01 else "green"
    return Text("█" * n, style=style) + Text("·" * (WIDTH - n), style="dim")


def _name(row: dict[str, Any], multi: bool, width: int = NAME_WIDTH) -> str:
    """Indented by depth; long names lose their start, not the leaf that says what the module is."""
    indent = "  " * min(row.get("depth", 0), 6)
    name = row["module"] or "<root>"
    if multi:
        name = f"#{row['input_index']} {name}"
    room = width - len(indent)
    return indent + (name if len(name) <= room else "…" + name[-(room - 1):])


def headroom_strip(rep: Report, max_rows: int = 40) -> Group:
    """One line per module call of ``rep.modules`` (execution order); at most ``max_rows`` lines,
    the rest collapsed into "⋮ N calls" lines."""
    from ..dtypes import limits

    rows = rep.modules or []
    dt = reference_dtype((rep.run or {}).get("dtype"))
    mx = limits(dt).max
    prod = producer_index(rep)
    shown = pick_rows(rows, mx, prod, max_rows)
    multi = len({r["input_index"] for r in rows}) > 1
    tab = Table(show_edge=False, box=None, header_style="dim", pad_edge=False)
    for c, just in (("", "left"), ("module", "left"), ("type", "left"), (f"log10 |out| → {dt} max", "left"),
                    ("absmax", "right"), ("headroom", "right")):
        tab.add_column(c, justify=just, no_wrap=True, overflow="ellipsis")
    prev = -1
    for i in shown:
        if i - prev > 1:
            gap = rows[prev + 1:i]
            top = max((r["absmax"] or 0.0 for r in gap), default=0.0)
            tab.add_row("", Text(f"⋮ {len(gap)} call(s), absmax ≤ {top:.3g}", style="dim"), "", "", "", "")
        prev = i
        r = rows[i]
        name = _name(r, multi)
        is_prod = i == prod
        mark = Text("▶", style="bold red") if is_prod else Text("")
        frac = fraction(r, mx)
        head = "—" if math.isinf(frac) else ("∞" if frac == 0 else f"{1 / frac:.3g}x")
        absmax = "—" if r["absmax"] is None or is_bad(r) else f"{r['absmax']:.4g}"
        tab.add_row(mark, Text(name, style="bold red" if is_prod else ("red" if is_bad(r) else "")),
                    r["module_type"], _bar(r, mx), absmax, head)
    if prev < len(rows) - 1:
        gap = rows[prev + 1:]
        tab.add_row("", Text(f"⋮ {len(gap)} more call(s)", style="dim"), "", "", "", "")
    title = Text(f"headroom per module call ({len(rows)} calls, {dt} max {mx:.6g}; bar from {FLOOR:g} to the max)",
                 style="bold")
    return Group(title, tab)
