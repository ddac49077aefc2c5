"""The terminal view of a report: weights table, producer panel, diagnosis, replay matrix, verdict."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..report import Report

KIND_STYLE = {"nan": "bold red", "posinf": "bold magenta", "neginf": "bold blue"}


def _g(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        return f"{x:.4g}"
    return str(x)


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def header(rep: Report) -> Text:
    ck = rep.checkpoint or {}
    t = Text()
    t.append("nanhunter ", style="bold")
    t.append(f"{ck.get('path')}  ", style="cyan")
    t.append(f"{ck.get('format')} · {ck.get('n_tensors')} tensors · {_mb(ck.get('bytes') or 0)}")
    if rep.run:
        r = rep.run
        t.append(f"\nrun: {r['dtype']} on {r['device']} · {r['n_inputs']} input(s)")
        if r["failed_inputs"]:
            t.append(f" · failing: {r['failed_inputs']}", style="red")
    return t


def weights_table(rep: Report, max_rows: int = 20) -> Table | None:
    w = rep.weights or {}
    bad = w.get("nonfinite") or []
    near = w.get("near_overflow") or []
    if not bad and not near:
        return None
    tab = Table(title="weights", title_justify="left", show_edge=False, header_style="bold")
    for c in ("tensor", "dtype", "shape", "NaN", "+inf", "−inf", "first bad index", "absmax / headroom"):
        tab.add_column(c, overflow="fold")
    for b in bad[:max_rows]:
        tab.add_row(Text(b["name"], style="red"), b["dtype"], str(b["shape"]), _g(b["nan"]), _g(b["posinf"]),
                    _g(b["neginf"]), str(b["first_index"]), "")
    rest = max_rows - min(len(bad), max_rows)
    for n in near[:rest]:
        head = ", ".join(f"{d} {'OVER' if d in n['overflows'] else f'{h:.2g}x'}" for d, h in n["headroom"].items())
        tab.add_row(Text(n["name"], style="yellow"), n["dtype"], "", "0", "0", "0", "", f"{_g(n['absmax'])} · {head}")
    hidden = len(bad) + len(near) - max_rows
    if hidden > 0:
        tab.caption = f"... {hidden} more (see --json)"
    return tab


def _last_frames(rep: Report, n: int = 5) -> Table | None:
    fnf = rep.first_nonfinite
    mods = rep.modules or []
    if fnf is None or not mods:
        return None
    idx = next((i for i, m in enumerate(mods) if m["module"] == fnf.module and m["input_index"] == fnf.input_index
                and m["call_index"] == fnf.call_index), None)
    if idx is None:
        return None
    tab = Table(show_edge=False, box=None, header_style="dim", pad_edge=False)
    for c in ("", "module", "type", "in absmax", "out absmax", "NaN", "+inf", "−inf"):
        tab.add_column(c, justify="right" if "absmax" in c or c in ("NaN", "+inf", "−inf") else "left")
    for m in mods[max(0, idx - n): idx + 1]:
        mark = "▶" if m is mods[idx] else " "
        style = "bold red" if m is mods[idx] else None
        tab.add_row(mark, Text(m["module"] or "<root>", style=style), m["module_type"], _g(m["in_absmax"]),
                    _g(m["absmax"]), _g(m["nan"]), _g(m["posinf"]), _g(m["neginf"]))
    return tab


def producer_panel(rep: Report) -> Panel | None:
    f = rep.first_nonfinite
    if f is None:
        return None
    lines = Text()
    lines.append("module   ", style="dim")
    lines.append(f"{f.module or '<root>'}", style="bold")
    lines.append(f"  ({f.module_type}, call {f.call_index})\n")
    lines.append("op       ", style="dim")
    lines.append(f"{f.op or '—'}\n", style="bold")
    lines.append("value    ", style="dim")
    lines.append(f"{f.kind}", style=KIND_STYLE.get(f.kind, ""))
    lines.append(f"  role {f.role}  input #{f.input_index}\n")
    if f.source:
        lines.append("source   ", style="dim")
        lines.append(f"{f.source}\n", style="cyan")
    parts: list[Any] = [lines]
    frames = _last_frames(rep)
    if frames is not None:
        parts += [Text("last frames (execution order):", style="dim"), frames]
    return Panel(Group(*parts), title="[bold red]first non-finite value", title_align="left", border_style="red")


def replay_table(rep: Report) -> Table | None:
    if not rep.replay:
        return None
    tab = Table(title="replay of the failing region (vs float64)", title_justify="left", show_edge=False,
                header_style="bold")
    for c in ("dtype", "finite", "NaN", "+inf", "−inf", "absmax", "rel err"):
        tab.add_column(c, justify="right" if c not in ("dtype", "finite") else "left")
    for d, r in rep.replay.items():
        if d == "fp64":
            continue
        ok = Text("yes", style="green") if r["finite"] else Text("NO", style="bold red")
        tab.add_row(d, ok, _g(r["nan"]), _g(r["posinf"]), _g(r["neginf"]), _g(r["absmax"]), _g(r["rel_err"]))
    return tab


def diagnosis_panel(rep: Report) -> Panel | None:
    d = rep.diagnosis
    if d is None:
        return None
    body = Text()
    body.append(f"{d.cause}", style="bold yellow")
    body.append(f"  {d.summary}\n")
    if d.module is not None or d.op:
        body.append("where  ", style="dim")
        body.append(f"{d.module or '<root>'}  {d.op or ''}  ({d.dtype})\n")
    for e in d.evidence:
        body.append("  • ", style="dim")
        body.append(e + "\n")
    body.append("fix    ", style="bold green")
    body.append(d.fix)
    parts: list[Any] = [body]
    tab = replay_table(rep)
    if tab is not None:
        parts += [Text(""), tab]
    return Panel(Group(*parts), title="[bold]diagnosis", title_align="left", border_style="yellow")


def verdict(rep: Report) -> Text:
    code = rep.exit_code()
    if rep.bisect is not None:
        b = rep.bisect
        if b.finite_after:
            return Text(f"✔ keep {len(b.keep_modules)} module(s) in {b.keep_dtype}: run in {b.dtype} becomes finite "
                        f"(max rel err {_g(b.max_rel_err)}, {b.runs} runs)", style="bold green")
        return Text("✘ no module set fixes it: the run is non-finite even with every candidate kept in "
                    f"{b.keep_dtype}", style="bold red")
    if code == 0:
        msg = "✔ no NaN/Inf found"
        if rep.run is None:
            msg += " in the weights (weights-only scan)"
        if rep.near_misses:
            msg += f" · {len(rep.near_misses)} near miss(es)"
        return Text(msg, style="bold green")
    w = (rep.weights or {}).get("nonfinite") or []
    if rep.first_nonfinite is not None:
        f = rep.first_nonfinite
        cause = f" — {rep.diagnosis.cause}" if rep.diagnosis else ""
        return Text(f"✘ {f.kind} first produced by {f.module or '<root>'} at {f.op or '?'}{cause}", style="bold red")
    return Text(f"✘ {len(w)} tensor(s) with NaN/Inf in the checkpoint", style="bold red")


def render_body(rep: Report, c: Console, max_rows: int = 20, strip: bool = False) -> None:
    """Header, weights table, headroom strip (``strip`` and module rows), producer and diagnosis
    panels, near misses and notes: everything but the verdict line."""
    from .headroom import headroom_strip

    c.print(header(rep))
    strip_part = headroom_strip(rep) if strip and rep.modules else None
    for part in (weights_table(rep, max_rows), strip_part, producer_panel(rep), diagnosis_panel(rep)):
        if part is not None:
            c.print(part)
    for nm in rep.near_misses[:10]:
        c.print(Text("near miss: ", style="yellow") + Text(nm["message"]))
    for n in rep.notes:
        c.print(Text("note: ", style="dim") + Text(n))


def render(rep: Report, console: Console | None = None, max_rows: int = 20, strip: bool = False) -> None:
    """The full terminal view of one report; ``strip`` adds the per-module headroom strip."""
    c = console or Console(stderr=False)
    render_body(rep, c, max_rows, strip)
    c.print(verdict(rep))
