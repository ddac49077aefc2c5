"""A self-contained HTML report: inline CSS, the plot as a base64 PNG, no scripts, no network.

The row builders here (verdict, diagnosis, tables) are shared with the Markdown report, so both
say the same thing; each format only decides how it looks.
"""

from __future__ import annotations

import base64
import math
from html import escape
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..report import Report

# --- content shared with markdown.py ------------------------------------------------------------


def fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def failing(rep: Report) -> bool:
    return rep.exit_code() != 0


def verdict_line(rep: Report) -> str:
    if rep.check is not None:
        from .ci import verdict_text

        return verdict_text([rep])
    from .terminal import verdict

    return verdict(rep).plain


def title_of(reps: list[Report]) -> str:
    mode = "check" if any(r.check is not None for r in reps) else reps[0].mode if reps else "scan"
    name = (reps[0].checkpoint or {}).get("path") if len(reps) == 1 else f"{len(reps)} checkpoints"
    return f"nanhunter {mode} — {name}"


def meta_rows(rep: Report) -> list[tuple[str, str]]:
    ck = rep.checkpoint or {}
    rows = [("checkpoint", str(ck.get("path"))),
            ("format", f"{ck.get('format')} · {ck.get('n_tensors')} tensors · {_size(ck.get('bytes') or 0)}")]
    if rep.run:
        r = rep.run
        rows.append(("run", f"{r['dtype']} on {r['device']} · {r['n_inputs']} input(s)"
                            + (f" · failing inputs {r['failed_inputs']}" if r["failed_inputs"] else "")))
    else:
        rows.append(("run", "none (weights-only)"))
    if rep.check is not None:
        rows.append(("dtypes checked", ", ".join(rep.check.get("dtypes") or [])))
    return rows


def where_rows(rep: Report) -> list[tuple[str, str]]:
    f = rep.first_nonfinite
    if f is None:
        return []
    rows = [("module", f"{f.module or '<root>'} ({f.module_type}, call {f.call_index})"), ("op", f.op or "—"),
            ("value", f"{f.kind} · role {f.role} · input #{f.input_index}")]
    if f.tensor:
        rows.append(("tensor", f.tensor))
    if f.source:
        rows.append(("source", f.source))
    return rows


def lead_rows(rep: Report, n: int = 6) -> tuple[list[str], list[list[str]], int | None]:
    """The calls leading to the producer (execution order) and the producer's row among them."""
    from .headroom import producer_index

    p = producer_index(rep)
    head = ["module", "type", "in absmax", "out absmax", "NaN", "+inf", "−inf"]
    if p is None:
        return head, [], None
    mods = rep.modules or []
    lo = max(0, p - n)
    # A call whose outputs are all non-finite has no finite absmax (0 in the table): show —.
    rows = [[m["module"] or "<root>", m["module_type"], fmt(m["in_absmax"]),
             "—" if (m["nan"] or m["posinf"] or m["neginf"]) and not m["absmax"] else fmt(m["absmax"]), fmt(m["nan"]),
             fmt(m["posinf"]), fmt(m["neginf"])] for m in mods[lo:p + 1]]
    return head, rows, p - lo


def replay_rows(rep: Report) -> tuple[list[str], list[list[str]]]:
    head = ["dtype", "finite", "NaN", "+inf", "−inf", "absmax", "rel err vs fp64"]
    rows = [[d, "yes" if r["finite"] else "NO", fmt(r["nan"]), fmt(r["posinf"]), fmt(r["neginf"]), fmt(r["absmax"]),
             fmt(r["rel_err"])] for d, r in (rep.replay or {}).items() if d != "fp64"]
    return head, rows


def matrix_rows(rep: Report) -> tuple[list[str], list[list[str]]]:
    """check: one row per forward dtype (finite? where it broke, how close it came to the max)."""
    from ..dtypes import limits
    from .headroom import reference_dtype

    head = ["dtype", "finite", "failing inputs", "first non-finite", "cause", "largest output", "of max"]
    rows = []
    for d, r in ((rep.check or {}).get("runs") or {}).items():
        f = r.get("first_nonfinite")
        where = f"{f['module'] or '<root>'} @ {f['op'] or '?'} ({f['kind']})" if f else "—"
        big = f"{fmt(r['absmax'])} at {r['absmax_module'] or '<root>'}" if r.get("absmax") is not None else "—"
        share = r["absmax"] / limits(reference_dtype(d)).max if r.get("absmax") is not None else None
        frac = "—" if share is None else f"{share:.2%}" if share >= 1e-4 or share == 0 else f"{share:.1e}"
        rows.append([d, "yes" if r["finite"] else "NO", fmt(r["failed_inputs"] or "—"), where, r.get("cause") or "—",
                     big, frac])
    return head, rows


def check_rows(rep: Report) -> tuple[list[str], list[list[str]]]:
    head = ["status", "rule", "result"]
    rows = [[r["status"], r["rule"], r["message"]] for r in (rep.check or {}).get("results") or []]
    return head, rows


def weights_rows(rep: Report, max_rows: int = 30) -> tuple[list[str], list[list[str]], int]:
    """Non-finite tensors, then near-overflow ones; returns (header, rows, rows left out)."""
    w = rep.weights or {}
    head = ["tensor", "dtype", "shape", "NaN", "+inf", "−inf", "first bad index", "absmax / headroom"]
    rows = [[b["name"], b["dtype"], str(b["shape"]), fmt(b["nan"]), fmt(b["posinf"]), fmt(b["neginf"]),
             str(b["first_index"]), "non-finite"] for b in w.get("nonfinite") or []]
    for n in w.get("near_overflow") or []:
        head_room = ", ".join(f"{d} {'OVERFLOWS' if d in n['overflows'] else f'{h:.2g}x'}"
                              for d, h in n["headroom"].items())
        rows.append([n["name"], n["dtype"], "", "0", "0", "0", "", f"{fmt(n['absmax'])} · {head_room}"])
    return head, rows[:max_rows], max(0, len(rows) - max_rows)


def near_miss_lines(rep: Report) -> list[str]:
    return [nm["message"] for nm in rep.near_misses]


def plot_or_note(rep: Report) -> tuple[bytes | None, str | None]:
    """(PNG bytes, None), or (None, why there is no plot)."""
    from .plot import PlotUnavailable, plot_png

    try:
        png = plot_png(rep)
    except PlotUnavailable as e:
        return None, str(e)
    return (png, None) if png else (None, "nothing to plot: no module outputs and no floating-point weights")


def check_target(path: str | None, flag: str = "--report") -> None:
    """Fail early (exit 2) on a report path that cannot be written or has no known suffix."""
    if path is None:
        return
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm", ".md", ".markdown"):
        raise BadInput(f"{flag} {path}: use a name ending in .html (self-contained page) or .md (Markdown + PNG)")
    if p.is_dir():
        raise BadInput(f"{flag} {path}: is a directory; give a file path such as {p / 'report.html'}")
    if not p.parent.exists():
        raise BadInput(f"{flag} {path}: directory {p.parent} does not exist; create it or pick another path")


def write_report(reps: Report | list[Report], path: str) -> list[str]:
    """Write ``path`` as HTML or Markdown by its suffix; returns notes for the user (missing plot)."""
    check_target(path)
    reps = [reps] if isinstance(reps, Report) else reps
    if Path(path).suffix.lower() in (".md", ".markdown"):
        from .markdown import write_markdown

        return write_markdown(reps, path)
    return write_html(reps, path)


# --- HTML ---------------------------------------------------------------------------------------

CSS = """
:root { --red:#c62828; --green:#2e7d32; --amber:#b26a00; --ink:#1d2330; --mute:#5f6b7a; --line:#dfe3ea; }
* { box-sizing: border-box; }
body { margin: 0; background: #f4f6f9; color: var(--ink);
       font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 40px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 0 0 10px; }
h3 { font-size: 14px; margin: 14px 0 6px; color: var(--mute); text-transform: uppercase; letter-spacing: .04em; }
.sub { color: var(--mute); margin-bottom: 18px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 16px 20px; margin: 14px 0;
        box-shadow: 0 1px 2px rgba(20,30,50,.05); }
.verdict { font-size: 18px; font-weight: 650; padding: 14px 20px; border-radius: 10px; margin: 14px 0; color: #fff; }
.verdict.ok { background: var(--green); } .verdict.bad { background: var(--red); }
.verdict.warn { background: var(--amber); }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; color: var(--mute); font-weight: 600; border-bottom: 2px solid var(--line); padding: 6px 8px; }
th.num { text-align: right; }
td { border-bottom: 1px solid var(--line); padding: 5px 8px; vertical-align: top; }
tr:nth-child(even) td { background: #fafbfc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.hit td { background: #fdecea !important; font-weight: 600; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dl.kv dt { color: var(--mute); } dl.kv dd { margin: 0; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 650;
         color: #fff; }
.badge.pass { background: var(--green); } .badge.warn { background: var(--amber); }
.badge.fail { background: var(--red); } .badge.cause { background: #6a1b9a; }
.diag { border-left: 5px solid var(--amber); }
.fix { background: #e8f5e9; border: 1px solid #c8e6c9; border-radius: 8px; padding: 10px 14px; margin-top: 10px; }
.fix b { color: var(--green); }
ul.ev { margin: 6px 0 0; padding-left: 20px; } ul.ev li { margin: 2px 0; }
img.plot { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
.note { color: var(--mute); } .nm { color: var(--amber); }
.sep { border: 0; border-top: 3px double var(--line); margin: 34px 0; }
footer { color: var(--mute); font-size: 12px; margin-top: 26px; }
"""


def _table(head: list[str], rows: list[list[str]], hit: int | None = None, numeric: set[int] | None = None,
           status_col: int | None = None) -> str:
    numeric = numeric or set()
    out = ["<table><thead><tr>", *(f"<th{' class=num' if j in numeric else ''}>{escape(h)}</th>"
                                   for j, h in enumerate(head)), "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        out.append('<tr class="hit">' if i == hit else "<tr>")
        for j, cell in enumerate(row):
            if j == status_col:
                out.append(f'<td><span class="badge {escape(cell)}">{escape(cell)}</span></td>')
            else:
                cls = ' class="num"' if j in numeric else ""
                out.append(f"<td{cls}>{escape(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _kv(rows: list[tuple[str, str]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{escape(k)}</dt><dd class=\"mono\">{escape(v)}</dd>"
                                       for k, v in rows) + "</dl>"


def _verdict_class(rep: Report) -> str:
    if failing(rep):
        return "bad"
    warned = any(r["status"] == "warn" for r in (rep.check or {}).get("results") or [])
    return "warn" if warned or rep.near_misses else "ok"


def _section(rep: Report) -> tuple[str, list[str]]:
    notes: list[str] = []
    h = [f'<div class="card">{_kv(meta_rows(rep))}</div>',
         f'<div class="verdict {_verdict_class(rep)}">{escape(verdict_line(rep))}</div>']
    if rep.check is not None:
        head, rows = check_rows(rep)
        h.append(f'<div class="card"><h2>Check results</h2>{_table(head, rows, status_col=0)}</div>')
    d = rep.diagnosis
    if d is not None or rep.first_nonfinite is not None:
        h.append('<div class="card diag"><h2>Diagnosis</h2>')
        if d is not None:
            h.append(f'<p><span class="badge cause">{escape(d.cause)}</span> {escape(d.summary)}</p>')
            if d.module is not None or d.op:
                h.append(f'<p><b>where</b> <code>{escape(d.module or "<root>")}</code> '
                         f'<code>{escape(d.op or "")}</code> ({escape(str(d.dtype))})</p>')
            if d.evidence:
                h.append('<h3>Evidence</h3><ul class="ev">' + "".join(f"<li>{escape(e)}</li>" for e in d.evidence)
                         + "</ul>")
            h.append(f'<div class="fix"><b>Fix</b> {escape(d.fix)}</div>')
        if rep.first_nonfinite is not None:
            h.append(f"<h3>First non-finite value</h3>{_kv(where_rows(rep))}")
            head, rows, hit = lead_rows(rep)
            if rows:
                h.append("<h3>Calls leading to it (execution order)</h3>"
                         + _table(head, rows, hit=hit, numeric={2, 3, 4, 5, 6}))
        h.append("</div>")
    if rep.replay or (rep.check or {}).get("runs"):
        h.append('<div class="card"><h2>Dtype matrix</h2>')
        if (rep.check or {}).get("runs"):
            head, rows = matrix_rows(rep)
            h.append("<h3>Forward per dtype</h3>" + _table(head, rows, numeric={6}))
        if rep.replay:
            head, rows = replay_rows(rep)
            h.append("<h3>Replay of the failing region (vs float64)</h3>"
                     + _table(head, rows, hit=next((i for i, r in enumerate(rows) if r[1] == "NO"), None),
                              numeric={2, 3, 4, 5, 6}))
        h.append("</div>")
    png, why = plot_or_note(rep)
    h.append('<div class="card"><h2>Plot</h2>')
    if png:
        b64 = base64.b64encode(png).decode("ascii")
        alt = "output absmax per module call" if rep.modules else "weights absmax per tensor"
        h.append(f'<img class="plot" alt="{alt}" src="data:image/png;base64,{b64}">')
    else:
        h.append(f'<p class="note">{escape(why or "")}</p>')
        if why and "matplotlib" in why:
            notes.append(why)
    h.append("</div>")
    head, rows, more = weights_rows(rep)
    h.append('<div class="card"><h2>Weights</h2>')
    if rows:
        h.append(_table(head, rows, numeric={3, 4, 5}))
        if more:
            h.append(f'<p class="note">… {more} more (see the JSON report)</p>')
    else:
        n = (rep.weights or {}).get("n_tensors", 0)
        h.append(f'<p class="note">{n} tensors: none non-finite, none near a dtype limit.</p>')
    h.append("</div>")
    if rep.near_misses or rep.notes:
        h.append('<div class="card"><h2>Near misses and notes</h2><ul class="ev">')
        h += [f'<li class="nm">near miss: {escape(m)}</li>' for m in near_miss_lines(rep)]
        h += [f'<li class="note">{escape(n)}</li>' for n in rep.notes]
        h.append("</ul></div>")
    return "\n".join(h), notes


def html_report(reps: Report | list[Report]) -> tuple[str, list[str]]:
    """(the page, notes for the user)."""
    from .. import __version__

    reps = [reps] if isinstance(reps, Report) else reps
    title = title_of(reps)
    body, notes = [], []
    if len(reps) > 1:
        from .ci import verdict_text

        ok = all((r.check or {}).get("passed", not failing(r)) for r in reps)
        body.append(f'<div class="verdict {"ok" if ok else "bad"}">{escape(verdict_text(reps))}</div>')
    for i, rep in enumerate(reps):
        if len(reps) > 1:
            body.append(f'{"<hr class=sep>" if i else ""}<h2>{escape(str((rep.checkpoint or {}).get("path")))}</h2>')
        part, n = _section(rep)
        body.append(part)
        notes += [x for x in n if x not in notes]
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>{escape(title)}</h1>
<div class="sub">nanhunter {escape(__version__)} · report schema nanhunter.report/v1</div>
{chr(10).join(body)}
<footer>Generated by nanhunter {escape(__version__)}. Self-contained: no scripts, no network.</footer>
</main></body></html>
"""
    return page, notes


def write_html(reps: Report | list[Report], path: str) -> list[str]:
    page, notes = html_report(reps)
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as e:
        raise BadInput(f"--report {path}: cannot write ({e.strerror})") from None
    return notes
